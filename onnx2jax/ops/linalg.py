"""Matrix products: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import jax.numpy as jnp

from onnx2jax.numerics import dot_precision
from onnx2jax.ops.registry import register


def _matmul(a, b):
    # The precision the model was compiled with (onnx2jax.numerics): HIGHEST, float32 fidelity, unless asked.
    return jnp.matmul(a, b, precision=dot_precision(a, b))


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
    return jnp.einsum(equation.replace(" ", ""), *inputs, precision=dot_precision(*inputs))


@register("Det", 11, 22)
def det(x):
    return jnp.linalg.det(x).astype(x.dtype)
