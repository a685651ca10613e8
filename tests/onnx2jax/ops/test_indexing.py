"""Indexing ops against onnxruntime (and ONNX's reference evaluator where onnxruntime lags)."""

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnx2jax.errors import NodeError
from onnx2jax.ops import indexing
from onnx2jax.translate import translate

RNG = np.random.default_rng(1)


def _model(op, inputs, consts, opset, attrs, n_out=1):
    """A one-node model: ``inputs`` are fed at run time, ``consts`` are initializers ("" = omitted)."""
    graph = oh.make_graph(
        [oh.make_node(op, _order(inputs, consts), [f"y{i}" for i in range(n_out)], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()],
        [oh.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [onnx.numpy_helper.from_array(v, n) for n, v in consts.items() if v is not None],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def _order(inputs, consts):
    both = {**inputs, **consts}
    names = [n if both[n] is not None else "" for n in sorted(both, key=lambda n: int(n[1:]))]
    while names and not names[-1]:
        names.pop()
    return names


def check(op, opset, arrays, *, static=(), n_out=1, reference=False, **attrs):
    """Runs ``op`` through onnx2jax and onnxruntime (or the reference evaluator).

    Arrays are named x0, x1, ... by position; those at ``static`` positions become
    initializers; None omits an input.
    """
    inputs = {f"x{i}": a for i, a in enumerate(arrays) if i not in static and a is not None}
    consts = {f"x{i}": a for i, a in enumerate(arrays) if i in static or a is None}
    model = _model(op, inputs, consts, opset, attrs, n_out)
    if reference:
        expected = ReferenceEvaluator(model).run(None, dict(inputs))
    else:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, dict(inputs))
    actual = translate(model)(*inputs.values())
    assert len(actual) == len(expected)
    for e, a in zip(expected, actual):
        a = np.asarray(a)
        assert a.dtype == e.dtype, (a.dtype, e.dtype)
        assert a.shape == e.shape, (a.shape, e.shape)
        np.testing.assert_array_equal(a, e)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _i(*values, dtype=np.int64):
    return np.asarray(values, dtype=dtype)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis,indices", [(0, _i(0, -1, 2)), (1, _i([1, -2], [0, 3])), (-1, _i(2)), (0, _i(1, 0, dtype=np.int32))])
def test_gather(opset, axis, indices):
    check("Gather", opset, [_x(3, 4, 3), indices], axis=axis)


def test_gather_embedding_of_static_table():
    check("Gather", 13, [np.arange(20, dtype=np.int64).reshape(5, 4), _i([[1, 4], [-1, 0]])], static=(0,))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    x = _x(3, 4)
    indices = RNG.integers(-3, 3, size=(2, 4) if axis == 0 else (3, 2))
    check("GatherElements", 13, [x, indices], axis=axis)


@pytest.mark.parametrize("batch_dims,data,indices", [
    (0, _x(3, 4, 2), _i([0, 1], [2, -1])),
    (0, _x(3, 4, 2), _i([[1]], [[0]])),
    (1, _x(2, 3, 4), _i([[1, 2], [0, 0]], [[2, 3], [1, -1]])),
    (2, _x(2, 3, 4), _i([[1], [2], [0]], [[3], [0], [1]])),
])
def test_gather_nd(batch_dims, data, indices):
    check("GatherND", 13, [data, indices], batch_dims=batch_dims)


@pytest.mark.parametrize("opset,reduction", [(13, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(opset, reduction, axis):
    data = _x(3, 4)
    indices = _i([1, -1, 0, 2], [2, 0, 1, 1]) if axis == 0 else _i([1, -1], [3, 0], [2, 1])
    if reduction is None:  # duplicates are undefined without a reduction
        indices = _i([1, 0, 2, 2], [0, 2, 1, 0]) if axis == 0 else _i([1, 3], [3, 0], [2, 1])
    attrs = {} if reduction is None else {"reduction": reduction}
    check("ScatterElements", opset, [data, indices, _x(*indices.shape)], axis=axis, **attrs)


def test_scatter_opset9_is_scatter_elements():
    data = _x(3, 3)
    check("Scatter", 9, [data, _i([1, 0, 2], [0, 2, 1]), _x(2, 3)], axis=0)


@pytest.mark.parametrize("opset,reduction", [(13, None), (16, "add"), (16, "mul"), (18, "max"), (18, "min")])
def test_scatter_nd(opset, reduction):
    data = _x(4, 3, 2)
    if reduction is None:
        indices, updates = _i([1], [-1]), _x(2, 3, 2)
    else:
        indices, updates = _i([1, 2], [1, 2], [0, -1]), _x(3, 2)
    attrs = {} if reduction is None else {"reduction": reduction}
    check("ScatterND", opset, [data, indices, updates], **attrs)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    past, update = _x(2, 3, 6, 4), _x(2, 3, 3, 4)
    check("TensorScatter", 24, [past, update, _i(1, 3)], mode=mode, reference=True)
    if mode == "circular":
        check("TensorScatter", 24, [past, update, _i(5, 4)], mode=mode, reference=True)
    check("TensorScatter", 24, [past, update], mode=mode, reference=True)
    check("TensorScatter", 24, [_x(2, 5, 3), _x(2, 2, 3), _i(3, 0)], mode=mode, axis=1, reference=True)


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(opset, axis):
    indices = _i([0, 3, -1], [5, 2, -4]) if opset >= 11 else _i([0, 3, 1], [5, 2, 4])
    check("OneHot", opset, [indices, np.asarray([5], np.int64), np.asarray([2, 7], np.float32)], static=(1,), axis=axis)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -5])
def test_trilu(upper, k):
    check("Trilu", 14, [_x(2, 3, 5), None if k is None else np.asarray(k, np.int64)], upper=upper)


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis):
    x = _x(4, 4, 2)
    check("ReverseSequence", 10, [x, _i(4, 1, 3, 2)], time_axis=time_axis, batch_axis=batch_axis)


def test_nonzero_compress_unique_on_static_inputs():
    check("NonZero", 13, [_i([0, 2, 0], [1, 0, 3])], static=(0,))
    check("Compress", 11, [_x(3, 2), np.asarray([False, True, True])], static=(1,), axis=0)
    check("Compress", 11, [_x(3, 2), np.asarray([True, False, True, True])], static=(1,))
    data = _i(2, 1, 1, 3, 4, 3)
    for attrs in [{}, {"sorted": 0}]:
        check("Unique", 11, [data], static=(0,), n_out=4, **attrs)
    check("Unique", 11, [_i([1, 0, 0], [1, 0, 0], [2, 3, 4])], static=(0,), n_out=4, axis=0)


@pytest.mark.parametrize("op,arrays", [
    ("NonZero", [_x(3, 2)]),
    ("Unique", [_x(6)]),
    ("Compress", [_x(3, 2), np.asarray([False, True, True])]),
])
def test_data_dependent_shapes_compile_per_value_of_graph_inputs(op, arrays):
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    model = _model(op, inputs, {}, 13, {})
    n_out = len(model.graph.output)
    expected = ReferenceEvaluator(model).run(None, inputs)
    actual = translate(model)(*arrays)
    for e, a in zip(expected, actual[:n_out]):
        np.testing.assert_array_equal(np.asarray(a), e)


@pytest.mark.parametrize("op", ["NonZero", "Unique", "Compress"])
def test_data_dependent_shapes_refuse_runtime_values(op):
    # The data-dependent input is computed from a parameter (float initializers
    # are traced), so no graph input can be folded in its place. (A mask
    # computed from graph inputs would be folded: such inputs set a shape.)
    x = _x(3, 2)
    inputs = ["x0", "mask"] if op == "Compress" else ["mask"]
    graph = oh.make_graph(
        [oh.make_node("Greater", ["w", "zero"], ["mask"]), oh.make_node(op, inputs, ["y"])],
        "g",
        [oh.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, x.shape)],
        [oh.make_empty_tensor_value_info("y")],
        [
            onnx.numpy_helper.from_array(np.zeros((1,), np.float32), "zero"),
            onnx.numpy_helper.from_array(np.linspace(-1, 1, 6).astype(np.float32), "w"),
        ],
    )
    model = translate(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=10))
    with pytest.raises(NodeError, match="must be known while tracing"):
        model(x)


@pytest.mark.parametrize("op,fn", [
    ("NonZero", lambda x: indexing.non_zero(x)),
    ("Unique", lambda x: indexing.unique(x)),
    ("Compress", lambda x: indexing.compress(x, x > 0)),
])
def test_data_dependent_impls_raise_on_traced_values(op, fn):
    with pytest.raises(ValueError, match="output shape depends on runtime values"):
        jax.jit(fn)(_x(4))
