"""Reductions, ArgMax/ArgMin, CumSum/CumProd and TopK against onnxruntime."""

import numpy as np
import pytest

from onnx2jax.translate import translate
from opcheck import check, integer_arrays, normal_arrays, run, single_node_model

RNG = np.random.default_rng(0)
_f = normal_arrays(RNG)
_int = integer_arrays(RNG)


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
    check(op, _input_version(op), [_positive(2, 3, 4), axes], inits=(1,), keepdims=keepdims, rtol=1e-5)


@pytest.mark.parametrize("op", REDUCE)
@pytest.mark.parametrize("opset", [11, 13])
def test_reduce_axes_attribute(op, opset):
    if op == "ReduceSum" and opset == 13:
        pytest.skip("ReduceSum-13 takes axes as an input")
    check(op, opset, [_positive(2, 3, 4)], axes=[0, 2], keepdims=0, rtol=1e-5)
    check(op, opset, [_positive(2, 3, 4)], rtol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax"])
def test_reduce_noop_with_empty_axes(op):
    check(op, _input_version(op), [_positive(2, 3), np.array([], np.int64)], inits=(1,), noop_with_empty_axes=1)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_reduce_int_keeps_dtype(op, dtype):
    x = RNG.integers(-5, 5, (3, 4)).astype(dtype)
    check(op, _input_version(op), [x, np.array([1], np.int64)], inits=(1,))


@pytest.mark.parametrize("op, identity", [("ReduceSum", 0.0), ("ReduceProd", 1.0), ("ReduceMax", -np.inf),
                                          ("ReduceMin", np.inf), ("ReduceLogSumExp", -np.inf), ("ReduceL2", 0.0)])
def test_reduce_empty_set(op, identity):
    model, feeds = single_node_model(
        op, 20 if op in ("ReduceMax", "ReduceMin") else 18, [np.zeros((2, 0, 4), np.float32), np.array([1], np.int64)],
        inits=(1,),
    )
    (y,) = translate(model)(*feeds.values())
    assert y.shape == (2, 1, 4) and np.all(np.asarray(y) == identity)


def test_reduce_max_bool():
    check("ReduceMax", 20, [_f(3, 4) > 0, np.array([1], np.int64)], inits=(1,))
    check("ReduceMin", 20, [_f(3, 4) > 0, np.array([1], np.int64)], inits=(1,))


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
    check("CumSum", 14, [_f(3, 4), np.array(axis, np.int64)], inits=(1,), exclusive=exclusive, reverse=reverse, rtol=1e-5)
    check("CumSum", 14, [_int(3, 4), np.array(axis, np.int32)], inits=(1,), exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cum_prod(exclusive, reverse):
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    (y,) = run("CumProd", 26, [x, np.array(1, np.int64)], inits=(1,), exclusive=exclusive, reverse=reverse)
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
    check("TopK", 11, [x, np.array([3], np.int64)], inits=(1,), n_out=2, axis=axis, largest=largest)


def test_top_k_old_opsets():
    x = _f(4, 6)
    check("TopK", 10, [x, np.array([2], np.int64)], inits=(1,), n_out=2)
    check("TopK", 1, [x], n_out=2, k=2, axis=0)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cum_sum_axis_fed_at_run_time(axis):
    check("CumSum", 14, [_f(2, 3, 4), np.array(axis, np.int64)], exclusive=1, rtol=1e-5)
