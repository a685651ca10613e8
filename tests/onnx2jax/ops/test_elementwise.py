"""Elementwise ops against onnxruntime, over the opsets they are registered for."""

import numpy as np
import pytest

from opcheck import check, integer_arrays, normal_arrays, run

RNG = np.random.default_rng(0)
_f = normal_arrays(RNG)
_int = integer_arrays(RNG)


@pytest.mark.parametrize("opset", [7, 14])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((2, 3, 4), (4,)), ((3, 1), (1, 5))])
def test_arithmetic_float(op, opset, shapes):
    check(op, opset, [_f(*shapes[0]), _f(*shapes[1])], rtol=1e-5)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_arithmetic_int(op, dtype):
    low = 0 if dtype == np.uint8 else -20
    b = _int(3, 4, dtype=dtype, low=low)
    b[b == 0] = 3
    check(op, 14, [_int(3, 4, dtype=dtype, low=low), b])


def test_integer_div_truncates_toward_zero():
    a = np.array([7, -7, 7, -7], np.int32)
    b = np.array([2, 2, -2, -2], np.int32)
    (y,) = run("Div", 14, [a, b])
    np.testing.assert_array_equal(y, [3, -3, -3, 3])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_mod_int(fmod, dtype):
    b = _int(4, 5, dtype=dtype)
    b[b == 0] = 7
    check("Mod", 13, [_int(4, 5, dtype=dtype), b], fmod=fmod)


def test_mod_float_fmod():
    check("Mod", 13, [_f(4, 5) * 10, _f(4, 5) + 3], fmod=1, rtol=1e-5)


@pytest.mark.parametrize(
    "base, exponent",
    [
        (np.abs(_f(3, 4)), _f(3, 4)),
        (_f(3, 4), np.array([2, 3, 1, 0], np.int64)),
        (np.array([1, 2, 3], np.int32), np.array([4.0, 5.0, 2.0], np.float32)),
        (np.array([1, -2, 3], np.int64), np.array([3, 3, 2], np.int64)),
    ],
)
def test_pow_keeps_base_dtype(base, exponent):
    check("Pow", 15, [base, exponent], rtol=1e-5)


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_comparisons(op, dtype):
    a = _int(3, 4, low=-3, high=3).astype(dtype)
    check(op, 16 if "Or" in op else 13, [a, _int(4, low=-3, high=3).astype(dtype)])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logical(op):
    check(op, 7, [_f(3, 4) > 0, _f(4) > 0])


def test_not():
    check("Not", 1, [_f(3, 4) > 0])


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_bitwise(op, dtype):
    check(op, 18, [_int(3, 4, dtype=dtype, low=0, high=200), _int(4, dtype=dtype, low=0, high=200)])


def test_bitwise_not():
    check("BitwiseNot", 18, [_int(3, 4, dtype=np.int32)])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.uint64])
def test_bit_shift(direction, dtype):
    check("BitShift", 11, [_int(6, dtype=dtype, low=0, high=200), np.array([0, 1, 2, 3, 5, 7], dtype)], direction=direction)


UNARY = ["Abs", "Neg", "Ceil", "Floor", "Exp", "Sqrt", "Reciprocal", "Round", "Sign", "Erf", "Sin", "Cos",
         "Tan", "Atan", "Sinh", "Cosh", "Asinh", "IsNaN"]


@pytest.mark.parametrize("op", UNARY)
def test_unary(op):
    x = _f(3, 4) * 2
    if op in ("Sqrt", "Reciprocal"):
        x = np.abs(x) + 0.1
    if op == "Round":
        x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6, -2.6], np.float32)
    check(op, 13 if op not in ("Sin", "Cos", "Tan", "Atan", "Sinh", "Cosh", "Asinh") else 9, [x], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op, x", [("Log", np.abs(_f(5)) + 0.1), ("Acos", _f(5) / 5), ("Asin", _f(5) / 5),
                                   ("Acosh", np.abs(_f(5)) + 1), ("Atanh", _f(5) / 5)])
def test_unary_domain(op, x):
    check(op, 13 if op == "Log" else 9, [x], rtol=1e-5)


@pytest.mark.parametrize("negative, positive", [(1, 1), (0, 1), (1, 0)])
def test_is_inf(negative, positive):
    x = np.array([1.0, np.inf, -np.inf, np.nan, 0.0], np.float32)
    check("IsInf", 10, [x], detect_negative=negative, detect_positive=positive)


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
@pytest.mark.parametrize("opset", [8, 13])
def test_variadic_broadcast(op, opset):
    check(op, opset, [_f(2, 3, 4), _f(3, 1), _f(4)], rtol=1e-5)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_propagate_nan(op):
    a = np.array([1.0, np.nan, 3.0], np.float32)
    b = np.array([np.nan, 2.0, 1.0], np.float32)
    (y,) = run(op, 13, [a, b])
    assert np.isnan(y[:2]).all() and y[2] == (3.0 if op == "Max" else 1.0)


@pytest.mark.parametrize("op", ["Max", "Min"])
def test_max_min_int(op):
    check(op, 13, [_int(3, 4, dtype=np.int64), _int(4, dtype=np.int64)])


def test_where():
    check("Where", 16, [_f(3, 4) > 0, _f(3, 4), _f(4)])


@pytest.mark.parametrize("bounds", [(-0.5, 0.5), (None, 0.5), (-0.5, None), (None, None), (1.0, -1.0)])
def test_clip_inputs(bounds):
    lo, hi = (None if b is None else np.array(b, np.float32) for b in bounds)
    check("Clip", 13, [_f(3, 4), lo, hi])


def test_clip_int8():
    check("Clip", 13, [_int(3, 4, dtype=np.int8), np.array(-5, np.int8), np.array(5, np.int8)])


def test_clip_attributes():
    check("Clip", 6, [_f(3, 4)], min=-0.3, max=0.4)
    check("Clip", 6, [_f(3, 4)], max=0.4)


def test_legacy_broadcast_with_axis():
    # Add-6 (which onnxruntime no longer runs): B (3, 4) aligned on A (2, 3, 4, 5) from axis 1.
    a, b = _f(2, 3, 4, 5), _f(3, 4)
    (y,) = run("Add", 6, [a, b], broadcast=1, axis=1)
    np.testing.assert_allclose(y, a + b[:, :, None], rtol=1e-6)
    (y,) = run("Mul", 6, [a, _f(5)[None]], broadcast=1)
    assert y.shape == a.shape
