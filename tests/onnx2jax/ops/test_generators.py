"""Constant, ConstantOfShape, Range, EyeLike against onnxruntime; random ops by shape, dtype and range."""

import functools

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from onnx import TensorProto

import opcheck

# Static inputs (consts=) are Constant nodes, so that they are known while tracing (float
# initializers would be parameters); outputs typed by ONNX shape inference; dtypes must match.
# Range: onnxruntime accumulates start + delta + delta ...; ONNX specifies start + i * delta.
check = functools.partial(opcheck.check, outputs="inferred", count="equal", compare="allclose", rtol=1e-12, atol=0)
run = functools.partial(opcheck.run, infer_shapes=True)


@pytest.mark.parametrize("attrs", [
    {"value": onnx.numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))},
    {"value": onnx.numpy_helper.from_array(np.asarray([True, False]))},
    {"value_float": 2.5},
    {"value_floats": [1.0, -2.0]},
    {"value_int": 7},
    {"value_ints": [3, 4, 5]},
])
def test_constant(attrs):
    check("Constant", 21, **attrs)


def test_constant_sparse():
    sparse = oh.make_sparse_tensor(
        onnx.numpy_helper.from_array(np.asarray([5.0, 6.0], np.float32), "v"),
        onnx.numpy_helper.from_array(np.asarray([1, 6], np.int64), "i"),
        [2, 4],
    )
    (y,) = run("Constant", 13, sparse_value=sparse)
    np.testing.assert_array_equal(y, np.asarray([[0, 5, 0, 0], [0, 0, 6, 0]], np.float32))
    assert y.dtype == np.float32


def test_constant_opset1():
    check("Constant", 7, value=onnx.numpy_helper.from_array(np.asarray([1, 2], np.int32)))


@pytest.mark.parametrize("shape", [[2, 3], [0], [4, 0, 1], []])
@pytest.mark.parametrize("value", [None, np.asarray([3], np.int32), np.asarray([1.5], np.float16)])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    check("ConstantOfShape", 21, [np.asarray(shape, np.int64)], consts=(0,), **attrs)


@pytest.mark.parametrize("start,limit,delta", [
    (np.int64(0), np.int64(10), np.int64(3)),
    (np.int32(10), np.int32(4), np.int32(-3)),
    (np.float32(1.0), np.float32(2.0), np.float32(0.25)),
    (np.float64(-1.0), np.float64(1.0), np.float64(0.3)),
    (np.int64(5), np.int64(1), np.int64(2)),
])
def test_range(start, limit, delta):
    arrays = [np.asarray(start), np.asarray(limit), np.asarray(delta)]
    check("Range", 11, arrays, consts=(0, 1, 2))
    check("Range", 27, arrays, consts=(0, 1, 2), oracle="reference")


def test_range_float16_accumulates_in_float32():
    arrays = [np.asarray(2000, np.float16), np.asarray(2010, np.float16), np.asarray(1, np.float16)]
    check("Range", 27, arrays, consts=(0, 1, 2), oracle="reference")


@pytest.mark.parametrize("k", [0, 1, -2, 5])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", 9, [np.zeros((3, 4), np.float32)], **attrs)


@pytest.mark.parametrize("dtype,np_dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT16, np.float16)])
def test_random_normal_and_uniform(dtype, np_dtype):
    (y,) = run("RandomNormal", 22, shape=[1000, 4], dtype=dtype, mean=3.0, scale=0.5, seed=2.0)
    assert y.dtype == np_dtype and y.shape == (1000, 4)
    assert abs(float(y.astype(np.float64).mean()) - 3.0) < 0.05
    (again,) = run("RandomNormal", 22, shape=[1000, 4], dtype=dtype, mean=3.0, scale=0.5, seed=2.0)
    np.testing.assert_array_equal(y, again)  # the seed fixes the draw
    (y,) = run("RandomUniform", 22, shape=[3, 500], dtype=dtype, low=-2.0, high=-1.0)
    assert y.dtype == np_dtype and y.shape == (3, 500)
    assert y.min() >= -2.0 and y.max() <= -1.0


def test_random_like_ops_take_shape_and_dtype_from_input():
    x = np.zeros((2, 5), np.float64)
    (y,) = run("RandomNormalLike", 22, [x])
    assert y.dtype == np.float64 and y.shape == (2, 5)
    (y,) = run("RandomUniformLike", 22, [x], dtype=TensorProto.FLOAT, low=4.0, high=5.0)
    assert y.dtype == np.float32 and y.shape == (2, 5) and 4.0 <= y.min() and y.max() <= 5.0


def test_bernoulli():
    p = np.asarray([0.0, 1.0, 0.0, 1.0, 0.5] * 200, np.float32)
    (y,) = run("Bernoulli", 15, [p])
    assert y.dtype == np.float32 and y.shape == p.shape
    np.testing.assert_array_equal(y[p != 0.5], p[p != 0.5])
    assert 0.4 < y[p == 0.5].mean() < 0.6
    (y,) = run("Bernoulli", 22, [p], dtype=TensorProto.INT32, seed=3.0)
    assert y.dtype == np.int32 and set(np.unique(y)) <= {0, 1}


def test_multinomial():
    logits = np.log(np.asarray([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]], np.float32) + 1e-30)
    (y,) = run("Multinomial", 7, [logits], sample_size=50)
    assert y.dtype == np.int32 and y.shape == (2, 50)
    assert (y[0] == 1).all() and set(np.unique(y[1])) <= {0, 2}
    (y,) = run("Multinomial", 22, [logits], sample_size=4, dtype=TensorProto.INT64, seed=1.0)
    assert y.dtype == np.int64 and y.shape == (2, 4)
