"""Quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and the integer MatMul/Conv ops.

Integer arithmetic gives ONNX's reference's int32 results: in general inputs are
widened, zero points subtracted, then multiplied and accumulated in int32; an
8-bit 2-D weight of MatMulInteger/QLinearMatMul stays 8-bit and is multiplied
int8 x int8 -> int32 with the zero points' shares added from row and column sums
(``_integer_matmul``). Rounding is half-to-even (``jnp.round``), and integer
outputs saturate to their type's range.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import onnx
import onnx.helper

from onnx2jax.ops.conv import spatial_pads
from onnx2jax.ops.registry import register

_INT_RANGES = {
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(ml_dtypes.uint4): (0, 15),
    np.dtype(ml_dtypes.int4): (-8, 7),
    np.dtype(ml_dtypes.uint2): (0, 3),
    np.dtype(ml_dtypes.int2): (-2, 1),
}

_FLOAT8 = {
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e4m3fnuz),
    np.dtype(ml_dtypes.float8_e5m2),
    np.dtype(ml_dtypes.float8_e5m2fnuz),
}

_SMALL_FLOATS = {
    np.dtype(ml_dtypes.float4_e2m1fn),
    np.dtype(ml_dtypes.float6_e2m3fn),
    np.dtype(ml_dtypes.float6_e3m2fn),
}


def _np_dtype(onnx_type: int) -> np.dtype:
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))


def _broadcastable(value, shape, axis: int, block_size: int = 0):
    """A scale or zero point shaped to broadcast against an input of ``shape``.

    Per-tensor: a scalar (or one element). Per-axis: a 1-D vector along ``axis``,
    e.g. x (2, 3, 4), axis 1, scale (3,) -> (1, 3, 1). Blocked: the scale has x's
    rank and each entry covers ``block_size`` elements along ``axis``, e.g. x (2, 6),
    axis 1, block 4, scale (2, 2) -> repeated to (2, 8) then cut to (2, 6).
    """
    value = jnp.asarray(value)
    if value.ndim == 0:
        return value
    if value.size == 1:
        return value.reshape(())
    axis = axis % len(shape)
    if not block_size:
        if value.ndim != 1:
            raise ValueError(f"a per-axis scale must be 1-D, got shape {value.shape}")
        dims = [1] * len(shape)
        dims[axis] = value.size
        return value.reshape(dims)
    value = jnp.repeat(value, block_size, axis=axis)
    value = jax.lax.slice_in_dim(value, 0, shape[axis], axis=axis)
    if value.shape != tuple(shape):
        raise ValueError(
            f"blocked quantization: scale repeated {block_size}x along axis {axis} gives "
            f"{value.shape}, expected the input shape {tuple(shape)}"
        )
    return value


def _saturate_float8(x, dtype: np.dtype):
    """Clamps finite values to the float8 type's largest finite value (NaN stays NaN)."""
    big = float(ml_dtypes.finfo(dtype).max)
    return jnp.where(jnp.isnan(x), x, jnp.clip(x, -big, big))


def _quantize(x, scale, zero_point, *, axis, saturate, block_size, out_dtype, precision=None):
    shape = jnp.shape(x)
    scale = _broadcastable(scale, shape, axis, block_size)
    if precision:
        dtype = _np_dtype(precision)
        scaled = jnp.asarray(x).astype(dtype) / scale.astype(dtype)
    else:
        scaled = jnp.asarray(x) / scale
    if out_dtype in _INT_RANGES:
        q = jnp.round(scaled).astype(jnp.int32)
        if zero_point is not None:
            q = q + _broadcastable(zero_point, shape, axis, block_size).astype(jnp.int32)
        low, high = _INT_RANGES[out_dtype]
        return jnp.clip(q, low, high).astype(out_dtype)
    if out_dtype in _FLOAT8:
        if saturate:
            scaled = _saturate_float8(scaled.astype(jnp.float32), out_dtype)
        return scaled.astype(out_dtype)
    if out_dtype in _SMALL_FLOATS:
        if zero_point is not None:
            scaled = scaled + _broadcastable(zero_point, shape, axis, block_size).astype(scaled.dtype)
        return scaled.astype(out_dtype)
    raise ValueError(f"QuantizeLinear to {out_dtype} is not a quantized type")


def _output_type(zero_point, output_dtype) -> np.dtype:
    if zero_point is not None:
        zp_dtype = np.dtype(zero_point.dtype)
        if output_dtype and _np_dtype(output_dtype) != zp_dtype:
            raise ValueError(f"output_dtype {_np_dtype(output_dtype)} differs from the zero point's {zp_dtype}")
        return zp_dtype
    return _np_dtype(output_dtype) if output_dtype else np.dtype(np.uint8)


@register("QuantizeLinear", 10)
def quantize_linear_10(x, y_scale, y_zero_point=None):
    return _quantize(
        x, y_scale, y_zero_point, axis=1, saturate=1, block_size=0, out_dtype=_output_type(y_zero_point, 0)
    )


@register("QuantizeLinear", 13)
def quantize_linear_13(x, y_scale, y_zero_point=None, *, axis):
    return _quantize(
        x, y_scale, y_zero_point, axis=axis, saturate=1, block_size=0, out_dtype=_output_type(y_zero_point, 0)
    )


@register("QuantizeLinear", 19)
def quantize_linear_19(x, y_scale, y_zero_point=None, *, axis, saturate):
    return _quantize(
        x, y_scale, y_zero_point, axis=axis, saturate=saturate, block_size=0,
        out_dtype=_output_type(y_zero_point, 0),
    )


@register("QuantizeLinear", 21, 23, 24, 25, 28)
def quantize_linear(x, y_scale, y_zero_point=None, *, axis, saturate, block_size, output_dtype, precision=0):
    return _quantize(
        x, y_scale, y_zero_point, axis=axis, saturate=saturate, block_size=block_size,
        out_dtype=_output_type(y_zero_point, output_dtype), precision=precision,
    )


def _dequantize(x, scale, zero_point, *, axis, block_size, output_dtype=0):
    x = jnp.asarray(x)
    shape = x.shape
    dx = x.astype(jnp.float32)
    if zero_point is not None and np.dtype(x.dtype) not in _FLOAT8:
        dx = dx - _broadcastable(zero_point, shape, axis, block_size).astype(jnp.float32)
    y = dx * _broadcastable(scale, shape, axis, block_size)
    return y.astype(_np_dtype(output_dtype) if output_dtype else jnp.asarray(scale).dtype)


@register("DequantizeLinear", 10)
def dequantize_linear_10(x, x_scale, x_zero_point=None):
    return _dequantize(x, x_scale, x_zero_point, axis=1, block_size=0)


@register("DequantizeLinear", 13, 19)
def dequantize_linear_13(x, x_scale, x_zero_point=None, *, axis):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=0)


@register("DequantizeLinear", 21, 23, 24, 25, 28)
def dequantize_linear(x, x_scale, x_zero_point=None, *, axis, block_size, output_dtype=0):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype)


@register("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(x):
    x = jnp.asarray(x)
    x32 = x.astype(jnp.float32)
    high = jnp.maximum(jnp.float32(0), jnp.max(x32))
    low = jnp.minimum(jnp.float32(0), jnp.min(x32))
    scale = jnp.where(high == low, jnp.float32(1), high - low) / jnp.float32(255)
    zero = jnp.round(jnp.clip(-low / scale, 0, 255))
    y = jnp.clip(jnp.round(x32 / scale) + zero, 0, 255)
    return y.astype(jnp.uint8), scale.astype(x.dtype), zero.astype(jnp.uint8)


def _widen(x, zero_point, zp_shape=None):
    x = jnp.asarray(x).astype(jnp.int32)
    if zero_point is None:
        return x
    zp = jnp.asarray(zero_point).astype(jnp.int32)
    return x - (zp if zp_shape is None or zp.ndim == 0 else zp.reshape(zp_shape))


def _matmul_zero_point_a(a, zero_point):
    # A zero point for A is a scalar or one per row of A: (M,) -> (M, 1).
    if zero_point is not None and jnp.ndim(zero_point) == 1 and jnp.size(zero_point) > 1:
        return _widen(a, zero_point, (-1, 1))
    return _widen(a, zero_point)


def _int_matmul(a, b):
    return jnp.matmul(a, b, preferred_element_type=jnp.int32)


_EIGHT_BITS = (np.dtype(np.uint8), np.dtype(np.int8))


def _signed(x, zero_point, zp_shape=None):
    """8-bit ``x - zero_point`` as ``(x', c)``: int8 ``x'`` and an int32 ``c`` with ``x - zero_point = x' + c``.

    uint8 becomes int8 by flipping the top bit (``x - 128``, a same-size elementwise pass, no widening).
    """
    shift = 0
    if x.dtype == jnp.uint8:
        x = jax.lax.bitcast_convert_type(x ^ jnp.uint8(128), jnp.int8)
        shift = 128
    if zero_point is None:
        return x, jnp.int32(shift)
    zp = jnp.asarray(zero_point).astype(jnp.int32)
    if zp_shape is not None and zp.ndim == 1 and zp.size > 1:
        zp = zp.reshape(zp_shape)
    return x, shift - zp


def _integer_matmul(a, b, a_zero_point, b_zero_point):
    """``(A - a_zero_point) @ (B - b_zero_point)`` in int32, the same integers as ONNX's reference.

    A 2-D 8-bit B (a weight) is multiplied as int8 x int8 -> int32 (XLA's integer GEMM, several times faster
    than the int32 product of widened copies at prefill sizes, and B stays 8-bit: no int32 copy of the weight a
    call): with ``x - zero_point = x' + c`` (``_signed``), ``sum (a' + ca)(b' + cb) = a'.b' + cb sum a' +
    ca sum b' + K ca cb``, exact in int32 (wrapping like the direct form). Other shapes widen to int32.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    if b.ndim != 2 or a.ndim < 2 or a.dtype not in _EIGHT_BITS or b.dtype not in _EIGHT_BITS:
        return _int_matmul(_matmul_zero_point_a(a, a_zero_point), _widen(b, b_zero_point))
    a8, ca = _signed(a, a_zero_point, (-1, 1))  # one zero point a row of A: (M,) -> (M, 1)
    b8, cb = _signed(b, b_zero_point)  # one a column of B: (N,) broadcasts along the output's last axis
    k = b.shape[0]
    # B's column sums come out of the same product, as one more row of ones: a sum over B's K axis on its own
    # is split by XLA CPU into a reduce-window over an int32 copy of B.
    rows = jnp.concatenate([a8.reshape(-1, k), jnp.ones((1, k), jnp.int8)])
    both = jax.lax.dot_general(rows, b8, (((1,), (0,)), ((), ())), preferred_element_type=jnp.int32)
    y, b_sums = both[:-1].reshape(*a.shape[:-1], b.shape[1]), both[-1]
    a_sums = jnp.sum(a8.astype(jnp.int32), axis=-1, keepdims=True)
    return y + cb * a_sums + ca * b_sums + jnp.int32(k) * ca * cb


@register("MatMulInteger", 10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    return _integer_matmul(a, b, a_zero_point, b_zero_point)


def _requantize(acc, multiplier, zero_point, out_dtype):
    y = acc.astype(jnp.float32) * multiplier
    if zero_point is not None:
        y = y + jnp.asarray(zero_point).astype(jnp.float32)
    low, high = _INT_RANGES[np.dtype(out_dtype)]
    return jnp.clip(jnp.round(y), low, high).astype(out_dtype)


@register("QLinearMatMul", 10, 21)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    acc = _integer_matmul(a, b, a_zero_point, b_zero_point)
    a_scale = jnp.asarray(a_scale).astype(jnp.float32)
    if a_scale.ndim == 1 and a_scale.size > 1:
        a_scale = a_scale.reshape(-1, 1)  # one scale per row of A
    multiplier = (
        a_scale
        * jnp.asarray(b_scale).astype(jnp.float32)
        / jnp.asarray(y_scale).astype(jnp.float32)
    )
    out_dtype = jnp.asarray(y_zero_point).dtype if y_zero_point is not None else jnp.asarray(a).dtype
    return _requantize(acc, multiplier, y_zero_point, out_dtype)


def _int_conv(x, w, *, auto_pad, dilations, group, kernel_shape, pads, strides):
    spatial = x.shape[2:]
    n = len(spatial)
    kernel = tuple(kernel_shape) if kernel_shape else w.shape[2:]
    strides = tuple(strides) if strides else (1,) * n
    dilations = tuple(dilations) if dilations else (1,) * n
    padding = spatial_pads(auto_pad, spatial, kernel, strides, dilations, pads)
    return jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=padding,
        rhs_dilation=dilations,
        feature_group_count=group,
        preferred_element_type=jnp.int32,
    )


@register("ConvInteger", 10)
def conv_integer(
    x, w, x_zero_point=None, w_zero_point=None, *, auto_pad, dilations=None, group,
    kernel_shape=None, pads=None, strides=None,
):
    xi = _widen(x, x_zero_point)
    wi = _widen(w, w_zero_point, (-1,) + (1,) * (jnp.ndim(w) - 1))
    return _int_conv(
        xi, wi, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
        pads=pads, strides=strides,
    )


@register("QLinearConv", 10)
def qlinear_conv(
    x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, *,
    auto_pad, dilations=None, group, kernel_shape=None, pads=None, strides=None,
):
    xi = _widen(x, x_zero_point)
    wi = _widen(w, w_zero_point, (-1,) + (1,) * (jnp.ndim(w) - 1))
    acc = _int_conv(
        xi, wi, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
        pads=pads, strides=strides,
    )
    channel = (1, -1) + (1,) * (acc.ndim - 2)
    if b is not None:
        acc = acc + jnp.asarray(b).astype(jnp.int32).reshape(channel)
    w_scale = jnp.asarray(w_scale).astype(jnp.float32)
    if w_scale.ndim == 1 and w_scale.size > 1:
        w_scale = w_scale.reshape(channel)
    multiplier = jnp.asarray(x_scale).astype(jnp.float32) * w_scale / jnp.asarray(y_scale).astype(jnp.float32)
    out_dtype = jnp.asarray(y_zero_point).dtype if y_zero_point is not None else jnp.asarray(x).dtype
    return _requantize(acc, multiplier, y_zero_point, out_dtype)
