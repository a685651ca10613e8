"""Quantization ops against onnxruntime: per-tensor, per-axis and blocked (De)QuantizeLinear, integer MatMul/Conv."""

import functools

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = functools.partial(opcheck.normal_arrays(RNG), scale=4.0)
# Static inputs (inits=) are initializers; outputs stay untyped.
check = functools.partial(opcheck.check, outputs=None)


@pytest.mark.parametrize("opset", [10, 13, 19, 21])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantize_dequantize_per_tensor(opset, dtype):
    zero = np.array(3 if dtype == np.int8 else 128, dtype)
    scale = np.array(0.05, np.float32)
    check("QuantizeLinear", opset, [_f(2, 3, 4), scale, zero])
    q = RNG.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, (2, 3, 4)).astype(dtype)
    check("DequantizeLinear", opset, [q, scale, zero])


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axis", [1, -1])
def test_quantize_dequantize_per_axis(opset, axis):
    x = _f(2, 3, 3)
    scale = np.array([0.02, 0.1, 0.5], np.float32)
    zero = np.array([0, 10, -5], np.int8)
    check("QuantizeLinear", opset, [x, scale, zero], axis=axis)
    q = RNG.integers(-128, 127, (2, 3, 3)).astype(np.int8)
    check("DequantizeLinear", opset, [q, scale, zero], axis=axis)


def test_quantize_without_zero_point_is_uint8():
    check("QuantizeLinear", 13, [_f(5), np.array(0.1, np.float32)])


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_quantize_16_bit(dtype):
    check("QuantizeLinear", 21, [_f(4, 5, scale=300.0), np.array(0.01, np.float32), np.array(7, dtype)])


def test_blocked_quantize_dequantize():
    x = _f(4, 6)
    scale = np.abs(_f(4, 2, scale=0.1)) + 0.01
    zero = RNG.integers(-3, 3, (4, 2)).astype(np.int8)
    check("QuantizeLinear", 21, [x, scale, zero], axis=1, block_size=3)
    q = RNG.integers(-128, 127, (4, 6)).astype(np.int8)
    check("DequantizeLinear", 21, [q, scale, zero], axis=1, block_size=3)


@pytest.mark.parametrize("saturate", [1, 0])
@pytest.mark.parametrize("dtype", [ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2])
def test_quantize_float8(dtype, saturate):
    # onnxruntime cannot hand float8 back to numpy: compare with ONNX's reference evaluator.
    from onnx.reference import ReferenceEvaluator

    x = np.array([-1e6, -3.0, 0.1, 2.5, 1e6], np.float32)
    node = oh.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], saturate=saturate)
    graph = oh.make_graph(
        [node], "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5])], [oh.make_empty_tensor_value_info("y")],
        [onh.from_array(np.array(0.5, np.float32), "s"), onh.from_array(np.array(0, dtype), "z")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=10)
    (expected,) = ReferenceEvaluator(model).run(None, {"x": x})
    (actual,) = translate(model)(x)
    assert np.asarray(actual).dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(actual).astype(np.float32), np.asarray(expected).astype(np.float32))


def test_dynamic_quantize_linear():
    for x in (_f(3, 4), np.abs(_f(3, 4)), -np.abs(_f(3, 4))):
        check("DynamicQuantizeLinear", 11, [x], n_out=3)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_matmul_integer(dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (2, 3, 4)).astype(dtype)
    b = RNG.integers(info.min, info.max, (4, 5)).astype(dtype)
    check("MatMulInteger", 10, [a, b, np.array(3, dtype), np.array(5, dtype)])
    check("MatMulInteger", 10, [a, b])


@pytest.mark.parametrize("opset", [10, 21])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_qlinear_matmul(opset, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (2, 3, 4)).astype(dtype)
    b = RNG.integers(info.min, info.max, (4, 5)).astype(dtype)
    f = lambda v: np.array(v, np.float32)  # noqa: E731
    check(
        "QLinearMatMul", opset,
        [a, f(0.02), np.array(2, dtype), b, f(0.03), np.array(1, dtype), f(0.5), np.array(4, dtype)],
        inits=(1, 2, 4, 5, 6, 7),
    )


@pytest.mark.parametrize(
    "attrs",
    [{}, {"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [0, 1, 0, 1]}, {"auto_pad": "SAME_UPPER"}, {"group": 2}],
)
def test_conv_integer(attrs):
    x = RNG.integers(0, 255, (1, 4, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 255, (6, 4 // attrs.get("group", 1), 3, 3)).astype(np.uint8)
    check("ConvInteger", 10, [x, w, np.array(100, np.uint8), np.array(120, np.uint8)], **attrs)


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1], "strides": [2, 2]}])
def test_qlinear_conv(attrs):
    x = RNG.integers(0, 255, (1, 3, 6, 6)).astype(np.uint8)
    w = RNG.integers(0, 255, (4, 3, 3, 3)).astype(np.uint8)
    f = lambda v: np.array(v, np.float32)  # noqa: E731
    bias = RNG.integers(-500, 500, (4,)).astype(np.int32)
    check(
        "QLinearConv", 10,
        [x, f(0.01), np.array(120, np.uint8), w, f(0.02), np.array(128, np.uint8), f(0.3), np.array(90, np.uint8), bias],
        inits=(1, 2, 4, 5, 6, 7, 8), atol=1,  # onnxruntime requantizes in float with its own rounding
        **attrs,
    )
