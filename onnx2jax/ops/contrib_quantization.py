"""onnxruntime's MatMulNBits (com.microsoft): a MatMul whose right operand is stored as blocks of n-bit integers.

``B`` is ``uint8 [N, n_blocks, blob_size]``: row n of the weight (output feature n) is cut along K into
``n_blocks = ceil(K / block_size)`` blocks of ``block_size`` values, each block packed ``8 / bits`` values per byte,
lowest bits first. Block (n, b) dequantizes as ``(q - zero_point[n, b]) * scales[n, b]``; the zero point is packed
the same way in uint8 (default ``2^(bits - 1)`` when absent) or given in the scales' float type. The packed
weights stay the program's input: the unpacking is jnp shifts and masks, so a weight lives on device at its
packed size and XLA fuses the dequantization into the product.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register

_HIGHEST = jax.lax.Precision.HIGHEST


def _unpack(packed, bits: int, count: int):
    """uint8 [..., m] -> uint8 [..., m * 8 / bits] of the packed values, lowest bits first, cut to ``count``."""
    per_byte = 8 // bits
    shifts = jnp.arange(per_byte, dtype=jnp.uint8) * bits
    values = (packed[..., None] >> shifts) & jnp.uint8((1 << bits) - 1)
    return values.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)[..., :count]


def dequantize_nbits(b, scales, zero_points, *, K: int, N: int, bits: int, block_size: int):
    """The float weight ``[N, K]`` of MatMulNBits' packed ``B``, in the scales' dtype."""
    n_blocks = -(-K // block_size)
    q = _unpack(b.reshape(N, n_blocks, -1), bits, block_size).astype(scales.dtype)  # [N, n_blocks, block]
    scale = scales.reshape(N, n_blocks, 1)
    if zero_points is None:
        zero = jnp.asarray(1 << (bits - 1), scales.dtype)
    elif zero_points.dtype == jnp.uint8:
        zero = _unpack(zero_points.reshape(N, -1), bits, n_blocks).astype(scales.dtype).reshape(N, n_blocks, 1)
    else:
        zero = zero_points.reshape(N, n_blocks, 1).astype(scales.dtype)
    return ((q - zero) * scale).reshape(N, n_blocks * block_size)[:, :K]


@register("MatMulNBits", 1, domain="com.microsoft")
def matmul_nbits(
    a, b, scales, zero_points=None, g_idx=None, bias=None, *,
    K: int, N: int, block_size: int, bits: int = 4, accuracy_level: int = 0,
):
    """A [..., K] @ dequantize(B).T [K, N] (+ bias); ``accuracy_level`` (a CPU kernel's compute-type hint) is ignored."""
    if g_idx is not None:
        raise NotImplementedError("MatMulNBits with g_idx (act-order group indices) is not implemented")
    if bits not in (2, 4, 8):
        raise NotImplementedError(f"MatMulNBits with bits={bits}: only 2, 4 and 8 are implemented")
    w = dequantize_nbits(b, scales, zero_points, K=K, N=N, bits=bits, block_size=block_size).astype(a.dtype)
    y = jnp.matmul(a, w.T, precision=_HIGHEST)
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return y
