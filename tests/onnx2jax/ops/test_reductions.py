"""Reductions, ArgMax/ArgMin, CumSum/CumProd and TopK against onnxruntime."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _model(op, arrays, static, opset, attrs, n_out=1):
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    feeds = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i not in static}
    inits = [onnx.numpy_helper.from_array(a, n) for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i in static]
    graph = oh.make_graph(
        [oh.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [oh.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10), feeds


def check(op, opset, arrays, *, static=(), n_out=1, rtol=1e-6, atol=1e-6, **attrs):
    """``op`` through onnx2jax and onnxruntime: same dtypes, shapes, and values within tolerance."""
    model, feeds = _model(op, arrays, static, opset, attrs, n_out)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    for info, e in zip(model.graph.output, expected):  # typed outputs, as exporters write them
        info.CopyFrom(oh.make_tensor_value_info(info.name, oh.np_dtype_to_tensor_dtype(e.dtype), e.shape))
    actual = translate(model)(*feeds.values())
    for e, a in zip(expected, actual):
        a = np.asarray(a)
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def run(op, opset, arrays, *, static=(), **attrs):
    model, feeds = _model(op, arrays, static, opset, attrs)
    return [np.asarray(o) for o in translate(model)(*feeds.values())]


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _int(*shape, dtype=np.int32, low=-20, high=20):
    return RNG.integers(low, high, shape).astype(dtype)



REDUCE = ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
          "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]


def _input_version(op):
    return 13 if op == "ReduceSum" else 18


def _positive(*shape):
    return (np.abs(RNG.standard_normal(shape)) + 0.5).astype(np.float32)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("axes, keepdims", [((1,), 1), ((0, -1), 0), (None, 0)])
def test_reduce_axes_input(op, axes, keepdims):
    axes = None if axes is None else np.array(axes, np.int64)
    check(op, _input_version(op), [_positive(2, 3, 4), axes], static=(1,), keepdims=keepdims, rtol=1e-5)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_axes_attribute(op, opset):
    if op == "ReduceSum" and opset == 13:
        pytest.skip("ReduceSum-13 takes axes as an input")
    check(op, opset, [_positive(2, 3, 4)], axes=[0, 2], keepdims=0, rtol=1e-5)
    check(op, opset, [_positive(2, 3, 4)], rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduce_noop_with_empty_axes(op):
    check(op, _input_version(op), [_positive(2, 3), np.array([], np.int64)], static=(1,), noop_with_empty_axes=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int_keeps_dtype(op, dtype):
    x = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    check(op, _input_version(op), [x, np.array([1], np.int64)], static=(1,))


@pytest.mark.parametrize("op, identity", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                          ("ReduceMin", np.inf), ("ReduceLogSumExp", -np.inf), ("ReduceL2", 0.0)])
def test_reduce_empty_set(op, identity):
    model, feeds = _model(op, [np.zeros((2, 0, 4), np.float32), np.array([1], np.int64)], (1,), 20 if op in ("ReduceMax", "ReduceMin") else 18, {})
    (y,) = translate(model)(*feeds.values())
    assert y.shape == (2, 1, 4) and np.all(np.asarray(y) == identity)


def test_reduce_max_bool():
    check("ReduceMax", 20, [_f(3, 4) > 0, np.array([1], np.int64)], static=(1,))
    check("ReduceMin", 20, [_f(3, 4) > 0, np.array([1], np.int64)], static=(1,))


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keepdims, last", [(0, 1, 0), (-1, 0, 0), (1, 1, 1), (-1, 0, 1)])
def test_arg_reduce(op, axis, keepdims, last):
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # many ties
    check(op, 13, [x], axis=axis, keepdims=keepdims, select_last_index=last)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reduce_old_opset(op):
    check(op, 11, [_f(3, 4)], axis=1)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
def test_cum_sum(exclusive, reverse, axis):
    check("CumSum", 14, [_f(3, 4), np.array(axis, np.int64)], static=(1,), exclusive=exclusive, reverse=reverse, rtol=1e-5)
    check("CumSum", 14, [_int(3, 4), np.array(axis, np.int32)], static=(1,), exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cum_prod(exclusive, reverse):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (y,) = run("CumProd", 26, [x, np.array(1, np.int64)], static=(1,), exclusive=exclusive, reverse=reverse)
    src = x[:, ::-1] if reverse else x
    expected = np.cumprod(src, axis=1)
    if exclusive:
        expected = np.concatenate([np.ones((2, 1), np.float32), expected[:, :-1]], axis=1)
    np.testing.assert_array_equal(y, expected[:, ::-1] if reverse else expected)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_top_k_ties_take_lower_index(largest, axis, dtype):
    x = RNG.integers(0, 4, (5, 6)).astype(dtype)
    check("TopK", 11, [x, np.array([3], np.int64)], static=(1,), n_out=2, axis=axis, largest=largest)


def test_top_k_old_opsets():
    x = _f(4, 6)
    check("TopK", 10, [x, np.array([2], np.int64)], static=(1,), n_out=2)
    check("TopK", 1, [x], n_out=2, k=2, axis=0)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cum_sum_axis_fed_at_run_time(axis):
    check("CumSum", 14, [_f(2, 3, 4), np.array(axis, np.int64)], exclusive=1, rtol=1e-5)
