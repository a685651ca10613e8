"""onnxruntime's fused activations (com.microsoft) that its model builder writes for GELU-family MLPs:
Gelu (erf), BiasGelu, FastGelu (the tanh approximation, optional bias) and QuickGelu (x * sigmoid(alpha * x))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _erf_gelu(x):
    return 0.5 * x * (1 + jax.lax.erf(x * np.float32(1 / np.sqrt(2))).astype(x.dtype))


@register("Gelu", 1, domain="com.microsoft")
def gelu(x):
    return _erf_gelu(x)


@register("BiasGelu", 1, domain="com.microsoft")
def bias_gelu(a, b):
    return _erf_gelu(a + b)


@register("FastGelu", 1, domain="com.microsoft")
def fast_gelu(x, bias=None):
    if bias is not None:
        x = x + bias
    inner = np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x * x * x)
    return (0.5 * x * (1 + jnp.tanh(inner))).astype(x.dtype)


@register("QuickGelu", 1, domain="com.microsoft")
def quick_gelu(x, *, alpha: float = 1.702):
    return (x * jax.nn.sigmoid(np.float32(alpha) * x)).astype(x.dtype)
