"""onnxruntime's fused normalisations that its model builder writes: SimplifiedLayerNormalization (RMSNorm,
default domain, no ONNX schema), SkipSimplifiedLayerNormalization and SkipLayerNormalization (com.microsoft).

ONNX has no schemas for these, so the attribute defaults are the Python defaults below, taken from onnxruntime
(``onnxruntime/core/graph/contrib_ops``): epsilon 1e-5 for SimplifiedLayerNormalization, 1e-12 for the Skip*
ops. The statistics are computed in float32 (onnxruntime's kernels accumulate in float for float16 inputs) and
the outputs cast back to the input type; mean and inv_std_var come out float32 with the normalised axes kept as
size 1.
"""

from __future__ import annotations

import jax.numpy as jnp

from onnx2jax.ops.registry import register

_SKIP_EPSILON = 1e-12  # kDefaultSkipLayerNormEpsilon in onnxruntime's bert_defs.cc


def _stat_dtype(x):
    return jnp.float64 if x.dtype == jnp.float64 else jnp.float32


def _rms(x, axes, epsilon):
    """x / sqrt(mean(x^2) + eps) in float32, and the float32 inverse root."""
    xs = x.astype(_stat_dtype(x))
    inv = 1.0 / jnp.sqrt(jnp.mean(xs * xs, axis=axes, keepdims=True) + epsilon)
    return xs * inv, inv


def _skip_sum(x, skip, bias):
    s = x + skip
    return s if bias is None else s + bias


@register("SimplifiedLayerNormalization", 1)
def simplified_layer_norm(x, scale, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1):
    """RMSNorm over the axes from ``axis`` on: (Y, inv_std_var). Y has the scale's type (onnxruntime's V), which
    mixed-precision models set apart from X's."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    y, inv = _rms(x, axes, epsilon)
    return (y * scale.astype(y.dtype)).astype(scale.dtype), inv


@register("SkipSimplifiedLayerNormalization", 1, domain="com.microsoft")
def skip_simplified_layer_norm(x, skip, gamma, bias=None, *, epsilon: float = _SKIP_EPSILON):
    """RMSNorm of x + skip (+ bias) over the last axis: (output, mean, inv_std_var, input_skip_bias_sum).

    onnxruntime leaves ``mean`` unwritten for the simplified norm; this returns zeros in its place.
    """
    s = _skip_sum(x, skip, bias)
    y, inv = _rms(s, (-1,), epsilon)
    return (y * gamma.astype(y.dtype)).astype(x.dtype), jnp.zeros_like(inv), inv, s


@register("SkipLayerNormalization", 1, domain="com.microsoft")
def skip_layer_norm(x, skip, gamma, beta=None, bias=None, *, epsilon: float = _SKIP_EPSILON):
    """LayerNorm of x + skip (+ bias) over the last axis: (output, mean, inv_std_var, input_skip_bias_sum)."""
    s = _skip_sum(x, skip, bias)
    ss = s.astype(_stat_dtype(s))
    mean = jnp.mean(ss, axis=-1, keepdims=True)
    centred = ss - mean
    inv = 1.0 / jnp.sqrt(jnp.mean(centred * centred, axis=-1, keepdims=True) + epsilon)
    y = centred * inv * gamma.astype(ss.dtype)
    if beta is not None:
        y = y + beta.astype(ss.dtype)
    return y.astype(x.dtype), mean, inv, s
