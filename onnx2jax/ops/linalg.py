"""Matrix products: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register

_HIGHEST = jax.lax.Precision.HIGHEST


def _matmul(a, b):
    # Full float32 precision: XLA's default may use bf16 passes on accelerators.
    return jnp.matmul(a, b, precision=_HIGHEST)


@register("MatMul", 1, 9, 13)
def matmul(a, b):
    return _matmul(a, b)


@register("Gemm", 1, 6, 7, 9, 11, 13)
def gemm(a, b, c=None, *, alpha, beta, transA, transB, broadcast=None):
    # ``broadcast`` (opsets 1 and 6) only allowed C to broadcast; numpy
    # broadcasting covers both settings for valid models.
    dtype = a.dtype
    a = a.T if transA else a
    b = b.T if transB else b
    y = _matmul(a, b)
    if alpha != 1.0:
        y = y * jnp.asarray(alpha, dtype)
    if c is not None:
        c = jnp.asarray(c)
        y = y + (c if beta == 1.0 else c * jnp.asarray(beta, dtype))
    return y.astype(dtype)


@register("Einsum", 12, 28)
def einsum(*inputs, equation):
    return jnp.einsum(equation.replace(" ", ""), *inputs, precision=_HIGHEST)


@register("Det", 11, 22)
def det(x):
    return jnp.linalg.det(x).astype(x.dtype)
