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


def _ints(dtype, *shape):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


# onnxruntime's CPU MatMulInteger takes A uint8 with B uint8 or int8, and A int8 with B int8.
_INT_PAIRS = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]


@pytest.mark.parametrize("a_dtype,b_dtype", _INT_PAIRS, ids=["u8u8", "u8s8", "s8s8"])
@pytest.mark.parametrize("zero_points", ["none", "scalar", "per_column"])
def test_matmul_integer_weight(a_dtype, b_dtype, zero_points):
    """B an 8-bit weight (an initializer), multiplied int8 x int8 -> int32 with the zero points' shares added
    from row and column sums: exactly onnxruntime's integers, for one row (decode), a few and 128 (a prompt),
    odd K, the extreme values included."""
    for m, k, n in ((1, 37, 5), (3, 300, 17), (128, 64, 33)):
        a, b = _ints(a_dtype, 2, m, k), _ints(b_dtype, k, n)
        a.flat[:2], b.flat[:2] = np.iinfo(a_dtype).min, np.iinfo(b_dtype).max
        arrays = [a, b]
        if zero_points == "scalar":
            arrays += [_ints(a_dtype), _ints(b_dtype)]
        elif zero_points == "per_column":  # onnxruntime takes A's zero point as a scalar only
            arrays += [_ints(a_dtype), _ints(b_dtype, n)]
        check("MatMulInteger", 10, arrays, inits=(1, 3), compare="equal")


def test_matmul_integer_keeps_the_weight_8_bit():
    """The compiled program multiplies the int8 weight as it is: no int32 (or int16) copy of it [K, N]."""
    import jax

    from onnx2jax.ops.quantization import matmul_integer

    k, n = 96, 40
    a, b = _ints(np.uint8, 4, k), _ints(np.int8, k, n)
    hlo = jax.jit(lambda a, b: matmul_integer(a, b, np.uint8(3), None)).lower(a, b).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]  # the program's buffers (fused computations' insides are not buffers)
    assert f"s8[{k},{n}]" in entry and "s32[4,40]" in entry  # the check below can fail
    assert f"s32[{k},{n}]" not in entry and f"s16[{k},{n}]" not in entry


@pytest.mark.parametrize("axis", [1, 0], ids=["by_n", "by_k"])
def test_matmul_integer_weight_sharded(axis):
    """The 8-bit weight split over 8 fake devices by N (column) or K (row, the partial products and B's column
    sums added across devices): the same integers as onnxruntime, and each device holds K * N / 8 bytes of it."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    from onnx2jax.ops.quantization import matmul_integer

    m, k, n = 3, 64, 48
    a, b, a_zero, b_zero = _ints(np.uint8, m, k), _ints(np.uint8, k, n), _ints(np.uint8), _ints(np.uint8, n)
    model, feeds = opcheck.single_node_model("MatMulInteger", 10, [a, b, a_zero, b_zero])
    session = opcheck.ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    spec = PartitionSpec(None, "x") if axis == 1 else PartitionSpec("x", None)
    placed = jax.device_put(b, NamedSharding(mesh, spec))
    assert placed.addressable_shards[0].data.nbytes == k * n // 8 and placed.dtype == np.uint8
    zero = jax.device_put(b_zero, NamedSharding(mesh, PartitionSpec("x" if axis == 1 else None)))
    got = jax.jit(lambda a, b, z: matmul_integer(a, b, a_zero, z))(a, placed, zero)
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.uint8), (np.int8, np.int8)], ids=["u8", "s8"])
def test_qlinear_matmul_weight_per_column(a_dtype, b_dtype):
    """QLinearMatMul with an 8-bit weight, per-column scales and zero points, 1 and 64 rows."""
    f = lambda v: np.asarray(v, np.float32)  # noqa: E731
    for m, k, n in ((1, 45, 6), (64, 130, 12)):
        a, b = _ints(a_dtype, m, k), _ints(b_dtype, k, n)
        b_scale = f(RNG.random(n) * 0.01 + 0.001)
        check(
            "QLinearMatMul", 21,
            [a, f(0.02), _ints(a_dtype), b, b_scale, _ints(b_dtype, n), f(0.5), _ints(a_dtype)],
            inits=(1, 2, 3, 4, 5, 6, 7), compare="equal",
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
