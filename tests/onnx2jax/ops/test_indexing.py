"""Indexing ops against onnxruntime (and ONNX's reference evaluator where onnxruntime lags)."""

import functools

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from onnx.reference import ReferenceEvaluator

import opcheck
from onnx2jax.ops import indexing
from onnx2jax.translate import translate

RNG = np.random.default_rng(1)
_x = opcheck.normal_arrays(RNG)
_i = opcheck.int_values
# Static inputs (inits=) are initializers (shape inputs); outputs typed by ONNX shape inference
# (which tells translate about int64); results must match exactly.
check = functools.partial(opcheck.check, outputs="inferred", count="equal", compare="equal", trim=True)


@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("axis,indices", [(0, _i(0, -1, 2)), (1, _i([1, -2], [0, 3])), (-1, _i(2)), (0, _i(1, 0, dtype=np.int32))])
def test_gather(opset, axis, indices):
    check("Gather", opset, [_x(3, 4, 3), indices], axis=axis)


def test_gather_embedding_of_static_table():
    check("Gather", 13, [np.arange(20, dtype=np.int64).reshape(5, 4), _i([[1, 4], [-1, 0]])], inits=(0,))


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
    check("TensorScatter", 24, [past, update, _i(1, 3)], mode=mode, oracle="reference")
    if mode == "circular":
        check("TensorScatter", 24, [past, update, _i(5, 4)], mode=mode, oracle="reference")
    check("TensorScatter", 24, [past, update], mode=mode, oracle="reference")
    check("TensorScatter", 24, [_x(2, 5, 3), _x(2, 2, 3), _i(3, 0)], mode=mode, axis=1, oracle="reference")


@pytest.mark.parametrize("opset", [9, 11])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(opset, axis):
    indices = _i([0, 3, -1], [5, 2, -4]) if opset >= 11 else _i([0, 3, 1], [5, 2, 4])
    check("OneHot", opset, [indices, np.asarray([5], np.int64), np.asarray([2, 7], np.float32)], inits=(1,), axis=axis)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1, -5])
def test_trilu(upper, k):
    check("Trilu", 14, [_x(2, 3, 5), None if k is None else np.asarray(k, np.int64)], upper=upper)


@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis):
    x = _x(4, 4, 2)
    check("ReverseSequence", 10, [x, _i(4, 1, 3, 2)], time_axis=time_axis, batch_axis=batch_axis)


def test_nonzero_compress_unique_on_static_inputs():
    check("NonZero", 13, [_i([0, 2, 0], [1, 0, 3])], inits=(0,))
    check("Compress", 11, [_x(3, 2), np.asarray([False, True, True])], inits=(1,), axis=0)
    check("Compress", 11, [_x(3, 2), np.asarray([True, False, True, True])], inits=(1,))
    data = _i(2, 1, 1, 3, 4, 3)
    for attrs in [{}, {"sorted": 0}]:
        check("Unique", 11, [data], inits=(0,), n_out=4, **attrs)
    check("Unique", 11, [_i([1, 0, 0], [1, 0, 0], [2, 3, 4])], inits=(0,), n_out=4, axis=0)


@pytest.mark.parametrize("op,arrays", [
    ("NonZero", [_x(3, 2)]),
    ("Unique", [_x(6)]),
    ("Compress", [_x(3, 2), np.asarray([False, True, True])]),
])
def test_data_dependent_shapes_compile_per_value_of_graph_inputs(op, arrays):
    inputs = {f"x{i}": a for i, a in enumerate(arrays)}
    model, _ = opcheck.single_node_model(op, 13, arrays, infer_shapes=True, trim=True)
    n_out = len(model.graph.output)
    expected = ReferenceEvaluator(model).run(None, inputs)
    actual = translate(model)(*arrays)
    for e, a in zip(expected, actual[:n_out]):
        np.testing.assert_array_equal(np.asarray(a), e)


@pytest.mark.parametrize("op", ["NonZero", "Unique", "Compress"])
def test_data_dependent_shapes_on_runtime_values_run_segmented(op):
    # The mask comes out of an If on a runtime condition, so it is a runtime
    # value: the node runs on the host between jitted segments (sharding.segments).
    x = _x(6) if op == "Compress" else _x(3, 2)  # Compress's condition is 1-D
    inputs = ["x0", "mask"] if op == "Compress" else ["mask"]
    graph = oh.make_graph(
        [
            oh.make_node("Greater", ["x0", "zero"], ["positive"]),
            oh.make_node("Less", ["x0", "zero"], ["negative"]),
            opcheck.runtime_choice("mask", "pick", "positive", "negative"),
            oh.make_node(op, inputs, ["y"], name="data_dependent"),
        ],
        "g",
        [oh.make_tensor_value_info("x0", onnx.TensorProto.FLOAT, x.shape), oh.make_tensor_value_info("pick", onnx.TensorProto.BOOL, [])],
        [oh.make_empty_tensor_value_info("y")],
        [onnx.numpy_helper.from_array(np.zeros((1,), np.float32), "zero")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=10)
    assert [s.kind for s in translate(model).segments] == ["jit", "host"]
    for pick in (True, False):  # ONNX's reference evaluator: onnxruntime has no Unique on bool
        feeds = {"x0": x, "pick": np.array(pick)}
        expected = ReferenceEvaluator(model).run(None, feeds)
        opcheck.assert_outputs(expected, translate(model)(**feeds), rtol=0, atol=0)


@pytest.mark.parametrize("op,fn", [
    ("NonZero", lambda x: indexing.non_zero(x)),
    ("Unique", lambda x: indexing.unique(x, sorted=1)),
    ("Compress", lambda x: indexing.compress(x, x > 0)),
])
def test_data_dependent_impls_raise_on_traced_values(op, fn):
    with pytest.raises(ValueError, match="output shape depends on runtime values"):
        jax.jit(fn)(_x(4))
