"""onnxruntime's block-quantized weights (com.microsoft): MatMulNBits, a MatMul whose right operand is stored as
blocks of n-bit integers, and GatherBlockQuantized, a Gather from such a table (a model builder's int4 embedding).

``B`` is ``uint8 [N, n_blocks, blob_size]``: row n of the weight (output feature n) is cut along K into
``n_blocks = ceil(K / block_size)`` blocks of ``block_size`` values, each block packed ``8 / bits`` values per byte,
lowest bits first. Block (n, b) dequantizes as ``(q - zero_point[n, b]) * scales[n, b]``; the zero point is packed
the same way in uint8 (default ``2^(bits - 1)`` when absent) or given in the scales' float type. The packed
weights stay the program's input: a weight lives on device at its packed size.

In a program for CPU (its mesh's devices, not the host: :func:`onnx2jax.numerics.platform`), 4-bit float32
products run the int4 kernel (`onnx2jax.ops.nbits_kernel`): the packed bytes are read
as they are, one device's shard at a time, and no float weight is made, at decode or prefill. Elsewhere
(GPU/TPU, other bit widths or float types, g_idx, ``jax.export``, or the kernel not built) the unpacking is
jnp shifts and masks in the same program as the dot, which XLA fuses on GPU/TPU; on CPU it materialises
the float weight every call.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import jax
import jax.numpy as jnp

from onnx2jax.ops import nbits_kernel
from onnx2jax.ops.registry import register
from onnx2jax.numerics import dot_precision, platform

_PORTABLE = contextvars.ContextVar("onnx2jax_nbits_portable", default=False)


@contextlib.contextmanager
def portable() -> Iterator[None]:
    """Traces MatMulNBits without the CPU kernel: a ``jax.export`` artifact can hold no custom call of ours."""
    token = _PORTABLE.set(True)
    try:
        yield
    finally:
        _PORTABLE.reset(token)


def _kernel_applies(a, scales, zero_points, bits: int, accuracy_level: int) -> bool:
    """Whether this product runs the int4 CPU kernel (which notes once if it was not built)."""
    if bits != 4 or a.dtype != jnp.float32 or scales.dtype != jnp.float32 or _PORTABLE.get():
        return False
    if zero_points is not None and zero_points.dtype not in (jnp.uint8, jnp.float32):
        return False
    if accuracy_level == 4 and zero_points is not None and zero_points.dtype != jnp.uint8:
        return False  # int8 compute with float zero points: the JAX path rounds A the same way
    if platform() != "cpu":  # the program's platform (its mesh's devices), not the host's: a TPU target from CPU
        return False
    return nbits_kernel.available()


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


def _int8_blocks(a, block_size: int):
    """``a`` rounded to int8 per block of ``block_size`` along its last axis (scale = max |a| / 127), as
    onnxruntime's CPU kernel quantizes the activations for accuracy_level 4; returned dequantized."""
    k = a.shape[-1]
    n_blocks = -(-k // block_size)
    padded = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, n_blocks * block_size - k)])
    blocks = padded.reshape(*a.shape[:-1], n_blocks, block_size)
    largest = jnp.max(jnp.abs(blocks), axis=-1, keepdims=True)
    scale = largest / jnp.asarray(127, a.dtype)
    # 127 / max, not 1 / scale: MLAS multiplies by this one, and the two differ in the last bit for some max,
    # which moves a value near a half by one step (and the product by ~3e-4 of its largest value)
    inverse = jnp.where(largest > 0, jnp.asarray(127, a.dtype) / jnp.where(largest > 0, largest, 1), 0)
    q = jnp.round(blocks * inverse)  # half to even, as the kernel's float -> int conversion rounds
    return (q * scale).reshape(padded.shape)[..., :k]


@register("MatMulNBits", 1, domain="com.microsoft")
def matmul_nbits(
    a, b, scales, zero_points=None, g_idx=None, bias=None, *,
    K: int, N: int, block_size: int, bits: int = 4, accuracy_level: int = 0,
):
    """A [..., K] @ dequantize(B).T [K, N] (+ bias).

    ``accuracy_level`` 4 (int8 compute, what the model builder writes for CPU) rounds float32 activations to
    int8 per block first, as onnxruntime's x86 CPU kernels do where they have an int8 path (4 and 8 bits; 2 bits
    from block size 32): greedy tokens then match onnxruntime's exactly rather than being slightly more
    accurate. Other levels, and the other cases, compute in the input type. On CPU at 4 bits and float32
    the int4 kernel computes it from the packed bytes (module docstring).
    """
    if g_idx is not None:
        raise NotImplementedError("MatMulNBits with g_idx (act-order group indices) is not implemented")
    if bits not in (2, 4, 8):
        raise NotImplementedError(f"MatMulNBits with bits={bits}: only 2, 4 and 8 are implemented")
    if _kernel_applies(a, scales, zero_points, bits, accuracy_level):
        n_blocks = -(-K // block_size)
        y = nbits_kernel.product(
            a, b.reshape(N, n_blocks, block_size // 2), scales, zero_points, block_size=block_size,
            accuracy=4 if accuracy_level == 4 else 0,
        )
        return y if bias is None else y + bias.astype(y.dtype)
    w = dequantize_nbits(b, scales, zero_points, K=K, N=N, bits=bits, block_size=block_size).astype(a.dtype)
    if accuracy_level == 4 and a.dtype == jnp.float32 and (bits != 2 or block_size >= 32):
        a = _int8_blocks(a, block_size)
    y = jnp.matmul(a, w.T, precision=dot_precision(a, w))
    if bias is not None:
        y = y + bias.astype(y.dtype)
    return y


@register("GatherBlockQuantized", 1, domain="com.microsoft")
def gather_block_quantized(
    data, indices, scales, zero_points=None, *,
    gather_axis: int = 0, quantize_axis: int = 1, block_size: int = 128, bits: int = 4,
):
    """Gather(data, indices) dequantized block-wise along ``quantize_axis``: ``(q - zero_point) * scale``.

    uint8 data packs ``8 / bits`` values per byte along the last axis (default zero point ``2^(bits - 1)``);
    int4/uint4 data holds one value per element (default zero point 0). Negative indices count from the end;
    out-of-range ones give zeros. Only the gathered rows are unpacked and dequantized.
    """
    rank = data.ndim
    gather_axis, quantize_axis = gather_axis % rank, quantize_axis % rank
    packed = data.dtype == jnp.uint8
    if packed and (gather_axis != 0 or quantize_axis != rank - 1):
        raise NotImplementedError("GatherBlockQuantized on uint8 data: gather_axis 0 and the last quantize_axis only")
    size = data.shape[gather_axis]
    indices = jnp.asarray(indices)
    index = jnp.where(indices < 0, indices + size, indices)
    inside = (index >= 0) & (index < size)
    index = jnp.clip(index, 0, size - 1)

    def rows(x, by=index):  # x gathered along gather_axis: the indices' axes replace it
        return jnp.take(x, by, axis=gather_axis)

    q = rows(data)
    if quantize_axis == gather_axis:  # each gathered element has its own block: the block's parameters
        scale = rows(scales, index // block_size)
        zero = jnp.zeros((), scales.dtype) if zero_points is None else rows(zero_points, index // block_size)
    else:
        axis = quantize_axis + (indices.ndim - 1 if quantize_axis > gather_axis else 0)
        length = data.shape[quantize_axis] * (8 // bits if packed else 1)
        q = _unpack(q, bits, length) if packed else q

        def per_element(blocks):  # one value per block -> one per element along the quantized axis
            return jax.lax.slice_in_dim(jnp.repeat(blocks, block_size, axis=axis), 0, length, axis=axis)

        scale = per_element(rows(scales))
        if zero_points is None:
            zero = jnp.asarray((1 << (bits - 1)) if packed else 0, scales.dtype)
        else:
            zero = rows(zero_points)
            zero = per_element(_unpack(zero, bits, scales.shape[-1]) if packed else zero)
    out = (q.astype(scales.dtype) - zero.astype(scales.dtype)) * scale
    keep = inside.reshape((1,) * gather_axis + inside.shape + (1,) * (rank - gather_axis - 1))
    return jnp.where(keep, out, jnp.zeros((), out.dtype))
