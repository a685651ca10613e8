"""Elementwise arithmetic, comparison, logical and bitwise ops, unary math, variadic Sum/Mean/Max/Min."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _legacy_broadcast(a, b, broadcast, axis):
    """Opset 1-6 binary ops: ``B`` broadcasts onto ``A`` only when ``broadcast=1``.

    With ``axis`` set, B's dims line up with A's starting at ``axis``: A (2, 3, 4, 5),
    B (3, 4), axis=1 -> B viewed as (3, 4, 1) so that numpy rules align it.
    Without ``axis`` B aligns with A's trailing dims, which is numpy's rule.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if not broadcast:
        if a.shape != b.shape:
            raise ValueError(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return a, b
    if axis is not None:
        axis = axis + a.ndim if axis < 0 else axis
        b = b.reshape(b.shape + (1,) * (a.ndim - axis - b.ndim))
    return a, b


def _binary(fn, *legacy_versions, name, modern_versions):
    """Registers ``fn(a, b)`` for the modern (numpy-broadcast) and legacy (broadcast attr) versions."""

    @register(name, *modern_versions)
    def modern(a, b):
        return fn(a, b)

    if legacy_versions:

        @register(name, *legacy_versions)
        def legacy(a, b, *, broadcast, axis=None, consumed_inputs=None):
            return fn(*_legacy_broadcast(a, b, broadcast, axis))

    return modern


def _is_int(x) -> bool:
    return jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer)


def _div(a, b):
    if _is_int(a):
        # ONNX integer division truncates toward zero, like C (lax.div does).
        a, b = jnp.broadcast_arrays(a, b)
        return jax.lax.div(a, b)
    return jnp.divide(a, b)


def _equal(a, b):
    if any(isinstance(v, np.ndarray) and v.dtype.kind in "OUS" for v in (a, b)):
        # Strings exist only as values known while tracing; compare them in numpy.
        return np.equal(np.asarray(a).astype(np.str_), np.asarray(b).astype(np.str_))
    return jnp.equal(a, b)


def _pow(x, y):
    x, y = jnp.asarray(x), jnp.asarray(y)
    if _is_int(x) and _is_int(y):
        # Integer powers wrap modulo 2**bits either way; compute in the base's type.
        return jnp.power(x, y.astype(x.dtype))
    wide = jnp.promote_types(x.dtype, y.dtype)
    if not jnp.issubdtype(wide, jnp.floating):
        wide = y.dtype if jnp.issubdtype(y.dtype, jnp.floating) else x.dtype
    return jnp.power(x.astype(wide), y.astype(wide)).astype(x.dtype)


add = _binary(jnp.add, 1, 6, name="Add", modern_versions=(7, 13, 14))
sub = _binary(jnp.subtract, 1, 6, name="Sub", modern_versions=(7, 13, 14))
mul = _binary(jnp.multiply, 1, 6, name="Mul", modern_versions=(7, 13, 14))
div = _binary(_div, 1, 6, name="Div", modern_versions=(7, 13, 14))
pow_ = _binary(_pow, 1, name="Pow", modern_versions=(7, 12, 13, 15))
and_ = _binary(jnp.logical_and, 1, name="And", modern_versions=(7,))
or_ = _binary(jnp.logical_or, 1, name="Or", modern_versions=(7,))
xor = _binary(jnp.logical_xor, 1, name="Xor", modern_versions=(7,))
equal = _binary(_equal, 1, name="Equal", modern_versions=(7, 11, 13, 19))
greater = _binary(jnp.greater, 1, name="Greater", modern_versions=(7, 9, 13))
less = _binary(jnp.less, 1, name="Less", modern_versions=(7, 9, 13))
greater_or_equal = _binary(jnp.greater_equal, name="GreaterOrEqual", modern_versions=(12, 16))
less_or_equal = _binary(jnp.less_equal, name="LessOrEqual", modern_versions=(12, 16))
bitwise_and = _binary(jnp.bitwise_and, name="BitwiseAnd", modern_versions=(18,))
bitwise_or = _binary(jnp.bitwise_or, name="BitwiseOr", modern_versions=(18,))
bitwise_xor = _binary(jnp.bitwise_xor, name="BitwiseXor", modern_versions=(18,))


@register("Mod", 10, 13, 28)
def mod(a, b, *, fmod):
    # fmod=1: C fmod, sign of the dividend; fmod=0: floor mod, sign of the divisor.
    return jnp.fmod(a, b) if fmod else jnp.remainder(a, b)


@register("BitShift", 11, 28)
def bit_shift(x, y, *, direction):
    # XLA shifts by >= bit width (or negative) give 0, or -1 for an arithmetic right
    # shift of a negative value, which is what BitShift-28 specifies.
    y = jnp.asarray(y).astype(jnp.asarray(x).dtype)
    if direction == "LEFT":
        return jnp.left_shift(x, y)
    if direction == "RIGHT":
        return jnp.right_shift(x, y)
    raise ValueError(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")


@register("Not", 1)
def not_(x):
    return jnp.logical_not(x)


@register("BitwiseNot", 18)
def bitwise_not(x):
    return jnp.invert(x)


def _special():
    """``jax.scipy.special``, imported when a model first uses it: importing it costs ~50 ms of every
    process's start (about a fifth of a one-device GPT-2's first result over onnxruntime's)."""
    from jax.scipy import special

    return special


def _unary(fn, name, *versions):
    @register(name, *versions)
    def impl(x, *, consumed_inputs=None):
        return fn(x)

    return impl


abs_ = _unary(jnp.abs, "Abs", 1, 6, 13)
neg = _unary(jnp.negative, "Neg", 1, 6, 13)
ceil = _unary(jnp.ceil, "Ceil", 1, 6, 13)
floor = _unary(jnp.floor, "Floor", 1, 6, 13)
exp = _unary(jnp.exp, "Exp", 1, 6, 13)
log = _unary(jnp.log, "Log", 1, 6, 13)
sqrt = _unary(jnp.sqrt, "Sqrt", 1, 6, 13)
reciprocal = _unary(jnp.reciprocal, "Reciprocal", 1, 6, 13)
round_ = _unary(jnp.round, "Round", 11, 22)  # half to even, as ONNX specifies
sign = _unary(jnp.sign, "Sign", 9, 13)
erf = _unary(lambda x: _special().erf(x), "Erf", 9, 13)
sin = _unary(jnp.sin, "Sin", 7, 22)
cos = _unary(jnp.cos, "Cos", 7, 22)
tan = _unary(jnp.tan, "Tan", 7, 22)
asin = _unary(jnp.arcsin, "Asin", 7, 22)
acos = _unary(jnp.arccos, "Acos", 7, 22)
atan = _unary(jnp.arctan, "Atan", 7, 22)
sinh = _unary(jnp.sinh, "Sinh", 9, 22)
cosh = _unary(jnp.cosh, "Cosh", 9, 22)
asinh = _unary(jnp.arcsinh, "Asinh", 9, 22)
acosh = _unary(jnp.arccosh, "Acosh", 9, 22)
atanh = _unary(jnp.arctanh, "Atanh", 9, 22)
is_nan = _unary(jnp.isnan, "IsNaN", 9, 13, 20)


@register("IsInf", 10, 20)
def is_inf(x, *, detect_negative, detect_positive):
    if detect_negative and detect_positive:
        return jnp.isinf(x)
    if detect_negative:
        return jnp.isneginf(x)
    if detect_positive:
        return jnp.isposinf(x)
    return jnp.zeros(jnp.shape(x), bool)


def _variadic(fn, name, *versions):
    @register(name, *versions)
    def impl(*xs, consumed_inputs=None):
        return functools.reduce(fn, [jnp.asarray(x) for x in xs])

    return impl


# jnp.maximum/minimum propagate NaN, as ONNX's Max/Min do.
max_ = _variadic(jnp.maximum, "Max", 1, 6, 8, 12, 13)
min_ = _variadic(jnp.minimum, "Min", 1, 6, 8, 12, 13)
sum_ = _variadic(jnp.add, "Sum", 1, 6, 8, 13)


@register("Mean", 1, 6, 8, 13)
def mean(*xs, consumed_inputs=None):
    total = functools.reduce(jnp.add, [jnp.asarray(x) for x in xs])
    return (total / len(xs)).astype(total.dtype)


@register("Where", 9, 16)
def where(condition, x, y):
    return jnp.where(condition, x, y)


def _clip(x, lo, hi):
    x = jnp.asarray(x)
    if lo is not None:
        x = jnp.maximum(x, jnp.asarray(lo, x.dtype))
    if hi is not None:
        x = jnp.minimum(x, jnp.asarray(hi, x.dtype))
    return x


@register("Clip", 1, 6)
def clip_attributes(x, *, min=None, max=None, consumed_inputs=None):  # noqa: A002 - ONNX names
    return _clip(x, min, max)


@register("Clip", 11, 12, 13)
def clip(x, min=None, max=None):  # noqa: A002 - ONNX names
    return _clip(x, min, max)
