"""The int4 CPU kernel of MatMulNBits (onnx2jax/_native/matmul_nbits.cc) called from the traced program.

The C++ kernel reads the packed weights and their block scales (and zero points) as they are, 4 bits a
weight, and multiplies them with A (int8 blocks of A at ``accuracy_level`` 4, as onnxruntime's CPU kernel
does; float otherwise), multi-threaded on XLA's intra-op pool. It is a ``jax.ffi`` custom call, built at
install (setup.py). :func:`product` wraps it in ``custom_partitioning`` so that, in a sharded program, each
device runs it on its own shard: B, the scales and the zero points split by N (the output's last axis comes
out split alike) or by whole K blocks (A's last axis split alike, the partial products added by one psum),
as the sharding rules place them (``sharding/rules/contrib_quantization.py``). A custom call has no SPMD
rule of its own; without the wrapper XLA would gather every weight onto every device.

Where the extension was not built (no compiler at install), :func:`available` is False and says why once:
the op then dequantizes in JAX (``onnx2jax.ops.contrib_quantization``).
"""

from __future__ import annotations

import functools
import sys

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import SdyShardingRule, custom_partitioning
from jax.sharding import NamedSharding, PartitionSpec

TARGET = "onnx2jax_matmul_nbits4"
ZP_NONE, ZP_PACKED, ZP_FLOAT = 0, 1, 2
_NOTE = (
    "onnx2jax: note: the int4 CPU kernel was not built at install ({}); MatMulNBits dequantizes every weight "
    "to float32 on every call instead (about 3-4x slower int4 decode on CPU, and a float32 copy of each "
    "weight per product); reinstall with a C++17 compiler to build it (docs/quantized.md)"
)


@functools.cache
def _load() -> str | None:
    """Registers the FFI target; None when done, else why the extension is missing."""
    try:
        from onnx2jax._native import _matmul_nbits
    except ImportError as error:
        return f"{type(error).__name__}: {error}"
    jax.ffi.register_ffi_target(TARGET, _matmul_nbits.matmul_nbits4, platform="cpu")
    return None


@functools.cache
def _noted() -> None:
    print(_NOTE.format(_load()), file=sys.stderr)


def available() -> bool:
    """Whether the kernel is built; the first time it is not, prints the one-line note of what that costs."""
    if _load() is None:
        return True
    _noted()
    return False


def _call(a, b, scales, zero_points, *, block_size: int, accuracy: int, zp_kind: int, simd: int):
    """The custom call on one device's arrays: a [M, K] float32, b [N, blocks, block_size / 2] uint8."""
    out = jax.ShapeDtypeStruct((a.shape[0], b.shape[0]), jnp.float32)
    return jax.ffi.ffi_call(TARGET, out)(
        a, b, scales, zero_points, block_size=block_size, accuracy=accuracy, zp_kind=zp_kind, simd=simd
    )


def _entries(sharding, rank: int) -> list:
    spec = list(sharding.spec) if isinstance(sharding, NamedSharding) else []
    return spec + [None] * (rank - len(spec))


@functools.partial(custom_partitioning, static_argnums=(4, 5, 6, 7))
def _partitioned(a, b, scales, zero_points, block_size, accuracy, zp_kind, simd):
    return _call(a, b, scales, zero_points, block_size=block_size, accuracy=accuracy, zp_kind=zp_kind, simd=simd)


def _plan(mesh, arg_shapes):
    """(N's mesh axes, K's mesh axes, M's mesh axes) as B and A are placed."""
    b = _entries(arg_shapes[1].sharding, 3)
    a = _entries(arg_shapes[0].sharding, 2)
    return b[0], b[1], a[0]


def _partition(block_size, accuracy, zp_kind, simd, mesh, arg_shapes, result_shape):
    n_axes, k_axes, m_axes = _plan(mesh, arg_shapes)
    used = {*_flat(n_axes), *_flat(k_axes)}
    if set(_flat(m_axes)) & used:
        m_axes = None
    zp_spec = PartitionSpec(n_axes, k_axes)  # with no zero points the scales stand in: placed alike
    arg_shardings = (
        NamedSharding(mesh, PartitionSpec(m_axes, k_axes)),
        NamedSharding(mesh, PartitionSpec(n_axes, k_axes, None)),
        NamedSharding(mesh, PartitionSpec(n_axes, k_axes)),
        NamedSharding(mesh, zp_spec),
    )
    result = NamedSharding(mesh, PartitionSpec(m_axes, n_axes))

    def lower(a, b, scales, zero_points):
        y = _call(a, b, scales, zero_points, block_size=block_size, accuracy=accuracy, zp_kind=zp_kind, simd=simd)
        return jax.lax.psum(y, k_axes) if k_axes is not None else y

    return mesh, lower, result, arg_shardings


def _flat(axes) -> tuple:
    if axes is None:
        return ()
    return tuple(axes) if isinstance(axes, tuple) else (axes,)


def _infer(block_size, accuracy, zp_kind, simd, mesh, arg_shapes, result_shape):
    n_axes, _, m_axes = _plan(mesh, arg_shapes)
    return NamedSharding(mesh, PartitionSpec(m_axes, n_axes))


_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer,
    # B [N, blocks, blob], scales [N, blocks], zero points [N, z]: N and the blocks as factors; A's K is its
    # own factor (K = blocks * block_size but for a last partial block), its split chosen in _partition.
    sharding_rule=SdyShardingRule(
        operand_mappings=(("m", "k"), ("n", "kb", "blob"), ("n", "kb"), ("n", "kz")),
        result_mappings=(("m", "n"),),
    ),
)


def product(a, b, scales, zero_points, *, block_size: int, accuracy: int, simd: int = 2):
    """``a [..., K] @ dequantize(b).T`` in float32 through the kernel; ``b`` uint8 [N, blocks, blob].

    ``scales`` [N, blocks] float32; ``zero_points`` None, packed uint8 [N, ceil(blocks / 2)] or float32
    [N, blocks]. ``accuracy`` 4 rounds A to int8 per block (integer zero points only). ``simd`` caps the
    kernel's loops: 0 plain C++, 1 AVX2, 2 AVX2 and AVX512-VNNI where the CPU has them (the tests compare each).
    """
    missing = _load()
    if missing is not None:
        raise RuntimeError(f"the int4 CPU kernel was not built ({missing}); check nbits_kernel.available() first")
    n, blocks = b.shape[0], b.shape[1]
    k = a.shape[-1]
    lead = a.shape[:-1]
    a2 = a.reshape(-1, k)
    scales = scales.reshape(n, blocks)
    if zero_points is None:
        # unread: the scales stand in (placed like them, no reshard), not a broadcast run on every call
        zp_kind, zero_points = ZP_NONE, scales
    elif zero_points.dtype == jnp.uint8:
        zp_kind, zero_points = ZP_PACKED, zero_points.reshape(n, -1)
    else:
        zp_kind, zero_points = ZP_FLOAT, zero_points.reshape(n, blocks).astype(jnp.float32)
    if k != blocks * block_size:  # a last partial block: K cannot be split then, so A is padded whole
        a2 = jnp.pad(a2, ((0, 0), (0, blocks * block_size - k)))
    y = _partitioned(a2, b, scales, zero_points, block_size, accuracy, zp_kind, simd)
    return y.reshape(*lead, n)
