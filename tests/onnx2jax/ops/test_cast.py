"""Cast, CastLike and BitCast against onnxruntime and ONNX's reference."""

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from onnx.reference import ReferenceEvaluator

import opcheck
from onnx2jax.translate import translate


def _typed(attrs):
    """Typed outputs: a Cast to a 64-bit type must switch on JAX's x64 mode."""
    return {"output_type": attrs["to"]} if isinstance(attrs.get("to"), int) else {}


def check(op, opset, arrays, **kwargs):
    opcheck.check(op, opset, arrays, **_typed(kwargs), **kwargs)


def run(op, opset, arrays, **kwargs):
    return opcheck.run(op, opset, arrays, **_typed(kwargs), **kwargs)


T = onnx.TensorProto
VALUES = np.array([0.0, -0.0, 1.5, -2.5, 3.7, -7.9, 100.25, -1000.0, 65504.0, 1e-3, 0.333], np.float32)


@pytest.mark.parametrize("src", [np.float32, np.float64, np.float16, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize("to", [T.FLOAT, T.DOUBLE, T.FLOAT16, T.INT32, T.INT64, T.INT8, T.BOOL])
def test_cast_numeric(src, to):
    x = VALUES if src != np.bool_ else VALUES > 0
    if np.dtype(src).kind in "iu":
        x = np.abs(x)[:8] if src == np.uint8 else x[:8]
    x = x.astype(src)
    if to == T.INT8 and np.dtype(src).kind == "f":
        x = x[np.abs(x.astype(np.float64)) < 100]
    check("Cast", 21, [x], to=to)


@pytest.mark.parametrize("opset", [6, 9, 13, 19])
def test_cast_opsets(opset):
    check("Cast", opset, [VALUES], to=T.INT64)
    check("Cast", opset, [VALUES.astype(np.float16)], to=T.DOUBLE)


def test_cast_bfloat16():
    # onnxruntime cannot hand bfloat16 to numpy; ml_dtypes rounds to nearest even like ONNX.
    (y,) = run("Cast", 13, [VALUES], to=T.BFLOAT16)
    assert y.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(y.view(np.uint16), VALUES.astype(ml_dtypes.bfloat16).view(np.uint16))
    (y,) = run("Cast", 13, [VALUES.astype(ml_dtypes.bfloat16)], to=T.FLOAT)
    np.testing.assert_array_equal(y, VALUES.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_cast_1_takes_a_type_name():
    (y,) = run("Cast", 1, [VALUES], to="INT32")
    np.testing.assert_array_equal(y, VALUES.astype(np.int32))


FLOAT8 = [T.FLOAT8E4M3FN, T.FLOAT8E4M3FNUZ, T.FLOAT8E5M2, T.FLOAT8E5M2FNUZ]
SPECIAL = np.array([0.4789, 0.5, 0.8191, 1000000.0, -1e6, 1e-7, np.inf, -np.inf, np.nan, 448.0, 57344.0, 240.0], np.float32)


def _reference(node_op, x, **attrs):
    model, feeds = opcheck.single_node_model(node_op, 24, [x], **_typed(attrs), **attrs)
    return ReferenceEvaluator(model).run(None, feeds)[0]


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", FLOAT8)
@pytest.mark.parametrize("src", [np.float32, np.float16])
def test_cast_float8_saturate(to, saturate, src):
    with np.errstate(over="ignore"):
        x = SPECIAL.astype(src)
    (y,) = run("Cast", 21, [x], to=to, saturate=saturate)
    expected = _reference("Cast", x, to=to, saturate=saturate)
    assert y.dtype == expected.dtype
    np.testing.assert_array_equal(y.astype(np.float32), expected.astype(np.float32))


SUB_BYTE_INTS = {T.INT4: (4, True), T.UINT4: (4, False), T.INT2: (2, True), T.UINT2: (2, False)}


@pytest.mark.parametrize("to", [T.INT4, T.UINT4, T.INT2, T.UINT2, T.FLOAT4E2M1, T.INT8])
def test_cast_small_types_match_onnx_in_range(to):
    # ONNX defines a float -> integer cast only in the integer type's range: compare there, with ONNX's reference.
    x = np.arange(-20, 20, dtype=np.float32) * 0.75
    (y,) = run("Cast", 25, [x], to=to)
    expected = _reference("Cast", x, to=to)
    assert y.dtype == expected.dtype
    if to in SUB_BYTE_INTS:
        info = ml_dtypes.iinfo(expected.dtype)
        in_range = (np.trunc(x) >= info.min) & (np.trunc(x) <= info.max)
        assert in_range.sum() >= 4 and not in_range.all()
        y, expected = y[in_range], expected[in_range]
    np.testing.assert_array_equal(y.astype(np.float32), expected.astype(np.float32))


@pytest.mark.parametrize("to", list(SUB_BYTE_INTS))
def test_cast_small_ints_wrap_out_of_range(to):
    # Out of range ONNX leaves the result undefined; onnx2jax states its choice (onnx2jax.ops.cast): truncate toward
    # zero, then wrap modulo 2**bits, as a C cast through a wider integer does. Checked against numpy's arithmetic.
    bits, signed = SUB_BYTE_INTS[to]
    x = np.array([-9.5, -9.0, -8.7, 8.0, 9.9, 15.2, 16.0, 17.5, -3.0, 3.0, 100.0, -1000.0], np.float32)
    (y,) = run("Cast", 25, [x], to=to)
    wrapped = np.trunc(x).astype(np.int64) % (1 << bits)
    if signed:
        wrapped = np.where(wrapped >= 1 << (bits - 1), wrapped - (1 << bits), wrapped)
    np.testing.assert_array_equal(y.astype(np.int64), wrapped)


@pytest.mark.parametrize("round_mode", ["up", "down", "nearest"])
def test_cast_e8m0_round_modes(round_mode):
    x = np.array([0.0, 0.124, 0.25, 1.1, 1.5, 3.0, 5.0, 1e38, 3e38, np.inf, np.nan], np.float32)
    (y,) = run("Cast", 24, [x], to=T.FLOAT8E8M0, round_mode=round_mode)
    expected = _reference("Cast", x, to=T.FLOAT8E8M0, round_mode=round_mode)
    np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("target", [np.float16, np.int64, np.float64])
def test_cast_like(target):
    check("CastLike", 15, [VALUES, np.zeros(2, target)])
    check("CastLike", 19, [VALUES, np.zeros(2, target)])


@pytest.mark.parametrize(
    "src, to",
    [(np.float32, T.INT32), (np.int64, T.DOUBLE), (np.uint16, T.INT16), (np.int8, T.UINT8), (np.bool_, T.UINT8), (np.float16, T.BFLOAT16)],
)
def test_bit_cast(src, to):
    with np.errstate(over="ignore"):
        x = (VALUES * 3).astype(src)
    (y,) = run("BitCast", 26, [x], to=to)
    np.testing.assert_array_equal(y, x.view(onnx.helper.tensor_dtype_to_np_dtype(to)))


def test_bit_cast_rejects_different_widths():
    with pytest.raises(Exception, match="equal bit width"):
        run("BitCast", 26, [VALUES], to=T.INT64)


def test_cast_string_constant_folds():
    # A string constant cast to float: JAX has no strings, but the value is static.
    node = oh.make_node("Cast", ["s"], ["y"], to=T.FLOAT)
    graph = oh.make_graph(
        [node], "g", [], [oh.make_tensor_value_info("y", T.FLOAT, [3])],
        [onnx.numpy_helper.from_array(np.array(["1.5", "-2", "1e3"], dtype=object), "s")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=10)
    np.testing.assert_array_equal(np.asarray(translate(model)()[0]), [1.5, -2.0, 1000.0])
