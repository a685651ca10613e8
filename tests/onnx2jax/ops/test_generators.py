"""Constant, ConstantOfShape, Range, EyeLike against onnxruntime; random ops by shape, dtype and range."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx.reference import ReferenceEvaluator

from onnx2jax.translate import translate


def _model(op, inputs, consts, opset, attrs):
    # consts come from Constant nodes, so that they are known while tracing
    # (float initializers would be parameters).
    constants = [oh.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(v)) for n, v in consts.items()]
    graph = oh.make_graph(
        [*constants, oh.make_node(op, [*inputs, *consts], ["y"], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()],
        [oh.make_empty_tensor_value_info("y")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model)


def run(op, opset, inputs=None, consts=None, **attrs):
    """(onnx2jax's output, the model) for a one-node model."""
    inputs, consts = inputs or {}, consts or {}
    model = _model(op, inputs, consts, opset, attrs)
    (y,) = translate(model)(*inputs.values())
    return np.asarray(y), model


def check(op, opset, inputs=None, consts=None, reference=False, **attrs):
    """onnx2jax equals onnxruntime (or ONNX's reference evaluator), dtype included."""
    actual, model = run(op, opset, inputs, consts, **attrs)
    if reference:
        (expected,) = ReferenceEvaluator(model).run(None, inputs or {})
    else:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (expected,) = session.run(None, inputs or {})
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    # Range: onnxruntime accumulates start + delta + delta ...; ONNX specifies start + i * delta.
    np.testing.assert_allclose(actual, expected, rtol=1e-12)


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
    y, _ = run("Constant", 13, sparse_value=sparse)
    np.testing.assert_array_equal(y, np.asarray([[0, 5, 0, 0], [0, 0, 6, 0]], np.float32))
    assert y.dtype == np.float32


def test_constant_opset1():
    check("Constant", 7, value=onnx.numpy_helper.from_array(np.asarray([1, 2], np.int32)))


@pytest.mark.parametrize("shape", [[2, 3], [0], [4, 0, 1], []])
@pytest.mark.parametrize("value", [None, np.asarray([3], np.int32), np.asarray([1.5], np.float16)])
def test_constant_of_shape(shape, value):
    attrs = {} if value is None else {"value": onnx.numpy_helper.from_array(value)}
    check("ConstantOfShape", 21, consts={"s": np.asarray(shape, np.int64)}, **attrs)


@pytest.mark.parametrize("start,limit,delta", [
    (np.int64(0), np.int64(10), np.int64(3)),
    (np.int32(10), np.int32(4), np.int32(-3)),
    (np.float32(1.0), np.float32(2.0), np.float32(0.25)),
    (np.float64(-1.0), np.float64(1.0), np.float64(0.3)),
    (np.int64(5), np.int64(1), np.int64(2)),
])
def test_range(start, limit, delta):
    consts = {"a": np.asarray(start), "b": np.asarray(limit), "c": np.asarray(delta)}
    check("Range", 11, consts=consts)
    check("Range", 27, consts=consts, reference=True)


def test_range_float16_accumulates_in_float32():
    consts = {"a": np.asarray(2000, np.float16), "b": np.asarray(2010, np.float16), "c": np.asarray(1, np.float16)}
    check("Range", 27, consts=consts, reference=True)


@pytest.mark.parametrize("k", [0, 1, -2, 5])
@pytest.mark.parametrize("dtype", [None, TensorProto.INT32, TensorProto.DOUBLE])
def test_eye_like(k, dtype):
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    check("EyeLike", 9, inputs={"x": np.zeros((3, 4), np.float32)}, **attrs)


@pytest.mark.parametrize("dtype,np_dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64), (TensorProto.FLOAT16, np.float16)])
def test_random_normal_and_uniform(dtype, np_dtype):
    y, _ = run("RandomNormal", 22, shape=[1000, 4], dtype=dtype, mean=3.0, scale=0.5, seed=2.0)
    assert y.dtype == np_dtype and y.shape == (1000, 4)
    assert abs(float(y.astype(np.float64).mean()) - 3.0) < 0.05
    again, _ = run("RandomNormal", 22, shape=[1000, 4], dtype=dtype, mean=3.0, scale=0.5, seed=2.0)
    np.testing.assert_array_equal(y, again)  # the seed fixes the draw
    y, _ = run("RandomUniform", 22, shape=[3, 500], dtype=dtype, low=-2.0, high=-1.0)
    assert y.dtype == np_dtype and y.shape == (3, 500)
    assert y.min() >= -2.0 and y.max() <= -1.0


def test_random_like_ops_take_shape_and_dtype_from_input():
    x = np.zeros((2, 5), np.float64)
    y, _ = run("RandomNormalLike", 22, inputs={"x": x})
    assert y.dtype == np.float64 and y.shape == (2, 5)
    y, _ = run("RandomUniformLike", 22, inputs={"x": x}, dtype=TensorProto.FLOAT, low=4.0, high=5.0)
    assert y.dtype == np.float32 and y.shape == (2, 5) and 4.0 <= y.min() and y.max() <= 5.0


def test_bernoulli():
    p = np.asarray([0.0, 1.0, 0.0, 1.0, 0.5] * 200, np.float32)
    y, _ = run("Bernoulli", 15, inputs={"p": p})
    assert y.dtype == np.float32 and y.shape == p.shape
    np.testing.assert_array_equal(y[p != 0.5], p[p != 0.5])
    assert 0.4 < y[p == 0.5].mean() < 0.6
    y, _ = run("Bernoulli", 22, inputs={"p": p}, dtype=TensorProto.INT32, seed=3.0)
    assert y.dtype == np.int32 and set(np.unique(y)) <= {0, 1}


def test_multinomial():
    logits = np.log(np.asarray([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]], np.float32) + 1e-30)
    y, _ = run("Multinomial", 7, inputs={"x": logits}, sample_size=50)
    assert y.dtype == np.int32 and y.shape == (2, 50)
    assert (y[0] == 1).all() and set(np.unique(y[1])) <= {0, 2}
    y, _ = run("Multinomial", 22, inputs={"x": logits}, sample_size=4, dtype=TensorProto.INT64, seed=1.0)
    assert y.dtype == np.int64 and y.shape == (2, 4)
