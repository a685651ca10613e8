"""Type conversion: Cast, CastLike, BitCast."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnx.helper

from onnx2jax.ops.registry import register

_SATURATING_FLOAT8 = frozenset(
    np.dtype(t)
    for t in (
        ml_dtypes.float8_e4m3fn,
        ml_dtypes.float8_e4m3fnuz,
        ml_dtypes.float8_e5m2,
        ml_dtypes.float8_e5m2fnuz,
    )
)
_SUB_BYTE_INTS = {
    np.dtype(ml_dtypes.int4): (4, True),
    np.dtype(ml_dtypes.uint4): (4, False),
    np.dtype(ml_dtypes.int2): (2, True),
    np.dtype(ml_dtypes.uint2): (2, False),
}
_E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
_FLOAT4 = np.dtype(ml_dtypes.float4_e2m1fn)


def _bit_width(dtype: np.dtype) -> int:
    if dtype in _SUB_BYTE_INTS:
        return _SUB_BYTE_INTS[dtype][0]
    return 4 if dtype == _FLOAT4 else dtype.itemsize * 8


def _onnx_dtype(to) -> np.dtype | None:
    """The numpy dtype of an ONNX type code (an int, or a name like "FLOAT" in Cast-1); None for strings."""
    if isinstance(to, str):
        to = onnx.TensorProto.DataType.Value(to.upper())
    if to == onnx.TensorProto.STRING:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))


def _is_string(x) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OUS"


def _cast_static_string(x, dtype: np.dtype | None):
    """String casts, only possible on values known while tracing (JAX has no string dtype)."""
    if not isinstance(x, (np.ndarray, np.generic)):
        raise NotImplementedError("Cast to or from string needs a value known while tracing; JAX has no string dtype")
    if dtype is None:
        return np.asarray(x).astype(np.str_).astype(object)
    # Parse through float64 for float types ("1e-5", "+INF", "NaN"; also bfloat16/float8, numpy kind "V").
    return np.asarray(x).astype(np.str_).astype(dtype if dtype.kind in "iub" else np.float64).astype(dtype)


def _wrap_sub_byte(x, dtype: np.dtype):
    """Float/int -> int4/uint4/int2/uint2: truncate toward zero, then wrap modulo 2**bits.

    ONNX's Cast leaves a float out of the integer type's range undefined; this is
    onnx2jax's stated choice, what a C cast through a wider integer gives, and
    what ONNX's reference gave with ml_dtypes before 0.7 (0.7 maps -9.0 -> int4
    to 0). XLA's convert would saturate instead (-9.0 -> -8). Pinned here, not
    borrowed from a library's version: tests/onnx2jax/ops/test_cast.py checks it
    against numpy's arithmetic.
    """
    bits, signed = _SUB_BYTE_INTS[dtype]
    v = jnp.asarray(x).astype(jnp.int32)  # truncates floats; wider ints keep their low bits
    mask = (1 << bits) - 1
    v = v & mask
    if signed:
        half = 1 << (bits - 1)
        v = (v ^ half) - half
    return v.astype(dtype)


def _to_e8m0(x, saturate: int, round_mode: str):
    """float -> float8e8m0 (a bare exponent), rounding as ONNX's ``round_mode`` says.

    Works on float32 bits: e = bits[30:23]. "up" adds one to e when any mantissa bit
    is set (1.1 -> 2.0); "nearest" adds one when the guard bit is set and rounding
    does not tie to an even exponent; saturate keeps e <= 254 (no overflow to NaN).
    NaN and Inf map to 0xFF.
    """
    bits = jax.lax.bitcast_convert_type(jnp.asarray(x).astype(jnp.float32), jnp.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(jnp.uint16)
    special = exponent == 0xFF
    if round_mode == "nearest":
        g = (bits & 0x400000) > 0
        r = (bits & 0x200000) > 0
        s = (bits & 0x1FFFFF) > 0
        lsb = exponent > 0
        round_up = g & (r | s | lsb)
    elif round_mode == "up":
        round_up = (bits & 0x7FFFFF) > 0
    elif round_mode == "down":
        round_up = jnp.zeros_like(special)
    else:
        raise ValueError(f"round_mode must be 'up', 'down' or 'nearest', got {round_mode!r}")
    round_up = round_up & ~special
    if saturate:
        round_up = round_up & (exponent != 0xFE)
    exponent = (exponent + round_up.astype(jnp.uint16)).astype(jnp.uint8)
    out = jnp.where(special, jnp.uint8(0xFF), exponent)
    return jax.lax.bitcast_convert_type(out, _E8M0)


def _cast(x, dtype: np.dtype | None, saturate: int = 1, round_mode: str = "up"):
    if dtype is None or _is_string(x):
        return _cast_static_string(x, dtype)
    x = jnp.asarray(x)
    if x.dtype == dtype:
        return x
    if dtype in _SUB_BYTE_INTS and x.dtype != np.bool_:
        return _wrap_sub_byte(x, dtype)
    if dtype == _E8M0:
        return _to_e8m0(x, saturate, round_mode)
    if dtype in _SATURATING_FLOAT8 and saturate and x.dtype != np.bool_:
        if jnp.issubdtype(x.dtype, jnp.integer):
            x = x.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
        limit = float(ml_dtypes.finfo(dtype).max)
        x = jnp.clip(x, -limit, limit)  # +-inf too; NaN stays NaN
    return x.astype(dtype)


@register("Cast", 1, 6, 9, 13)
def cast(x, *, to):
    return _cast(x, _onnx_dtype(to))


@register("Cast", 19, 21, 23)
def cast_19(x, *, to, saturate):
    return _cast(x, _onnx_dtype(to), saturate)


@register("Cast", 24, 25, 28)
def cast_24(x, *, to, saturate, round_mode):
    return _cast(x, _onnx_dtype(to), saturate, round_mode)


@register("CastLike", 15)
def cast_like(x, target):
    return _cast(x, None if _is_string(target) else np.dtype(target.dtype))


@register("CastLike", 19, 21, 23)
def cast_like_19(x, target, *, saturate):
    return _cast(x, None if _is_string(target) else np.dtype(target.dtype), saturate)


@register("CastLike", 24, 25)
def cast_like_24(x, target, *, saturate, round_mode):
    return _cast(x, None if _is_string(target) else np.dtype(target.dtype), saturate, round_mode)


@register("BitCast", 26)
def bit_cast(x, *, to):
    dtype = _onnx_dtype(to)
    if dtype is None:
        raise ValueError("BitCast does not support strings")
    x = jnp.asarray(x)
    if x.dtype == dtype:
        return x
    if _bit_width(x.dtype) != _bit_width(dtype):
        raise ValueError(f"BitCast needs types of equal bit width, got {x.dtype} -> {dtype}")
    # XLA cannot bitcast pred: go through uint8 (bool is one byte, 0 or 1).
    if x.dtype == np.bool_:
        x = x.astype(jnp.uint8)
    if dtype == np.bool_:
        return jax.lax.bitcast_convert_type(x, jnp.uint8) != 0
    return jax.lax.bitcast_convert_type(x, dtype)
