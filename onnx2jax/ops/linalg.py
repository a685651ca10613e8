"""Matrix products: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


@register("MatMul", 1, 9, 13)
def matmul(a, b):
    return jnp.matmul(a, b)
