"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization, RMSNormalization, GroupNormalization, LpNormalization, LRN, MeanVarianceNormalization."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register


def _channel_param(p, rank):
    """A per-channel vector (C,) shaped to broadcast against an (N, C, D1, ...) input."""
    p = jnp.asarray(p)
    if p.ndim == 1:
        return p.reshape((-1,) + (1,) * (rank - 2))
    return p  # spatial=0 (opset 7): a (C, D1, ...) per-activation parameter


def _stash_dtype(x, stash_type):
    # stash_type 1 = float32 (onnx.TensorProto.FLOAT); float64 inputs keep float64.
    if stash_type == 1 and x.dtype != jnp.float64:
        return jnp.float32
    return x.dtype


def _batch_norm_inference(x, scale, bias, mean, var, epsilon):
    rank = x.ndim
    scale, bias = _channel_param(scale, rank), _channel_param(bias, rank)
    mean, var = _channel_param(mean, rank), _channel_param(var, rank)
    y = (x - mean) / jnp.sqrt(var + epsilon) * scale + bias
    return y.astype(x.dtype)


@register("BatchNormalization", 1, 6)
def batch_norm_1(x, scale, bias, mean, var, *, epsilon, momentum, is_test, spatial, consumed_inputs=None):
    # Opsets 1 and 6 only compute Y from the running statistics with is_test=1;
    # training mode (is_test=0) also updated the statistics and is not implemented.
    if not is_test:
        raise NotImplementedError("BatchNormalization-1/6 training mode (is_test=0) is not implemented")
    return _batch_norm_inference(x, scale, bias, mean, var, epsilon)


@register("BatchNormalization", 9)
def batch_norm_9(x, scale, bias, mean, var, *, epsilon, momentum):
    return _batch_norm_inference(x, scale, bias, mean, var, epsilon)


@register("BatchNormalization", 7)
def batch_norm_7(x, scale, bias, mean, var, *, epsilon, momentum, spatial):
    return _batch_norm_inference(x, scale, bias, mean, var, epsilon)


@register("BatchNormalization", 14, 15)
def batch_norm_14(x, scale, bias, mean, var, *, epsilon, momentum, training_mode):
    if not training_mode:
        return _batch_norm_inference(x, scale, bias, mean, var, epsilon)
    axes = (0,) + tuple(range(2, x.ndim))
    batch_mean = jnp.mean(x, axis=axes)
    batch_var = jnp.var(x, axis=axes)
    y = _batch_norm_inference(x, scale, bias, batch_mean, batch_var, epsilon)
    running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype)
    running_var = (var * momentum + batch_var * (1 - momentum)).astype(var.dtype)
    return y, running_mean, running_var


@register("InstanceNormalization", 1, 6, 22)
def instance_norm(x, scale, bias, *, epsilon, consumed_inputs=None):
    axes = tuple(range(2, x.ndim))
    mean = jnp.mean(x, axis=axes, keepdims=True)
    var = jnp.var(x, axis=axes, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + epsilon)
    return (y * _channel_param(scale, x.ndim) + _channel_param(bias, x.ndim)).astype(x.dtype)


@register("LayerNormalization", 17)
def layer_norm(x, scale, bias=None, *, axis, epsilon, stash_type):
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    xs = x.astype(_stash_dtype(x, stash_type))
    mean = jnp.mean(xs, axis=axes, keepdims=True)
    diff = xs - mean
    inv_std = jax.lax.rsqrt(jnp.mean(diff * diff, axis=axes, keepdims=True) + epsilon)
    y = diff * inv_std * scale.astype(xs.dtype)
    if bias is not None:
        y = y + bias.astype(xs.dtype)
    # Mean and InvStdDev are of the stash type (float32 for float16 inputs), as
    # the schema's shape inference and onnxruntime give them.
    return y.astype(x.dtype), mean, inv_std


@register("RMSNormalization", 23)
def rms_norm(x, scale, *, axis, epsilon, stash_type):
    axis = axis % x.ndim
    axes = tuple(range(axis, x.ndim))
    xs = x.astype(_stash_dtype(x, stash_type))
    inv_rms = jax.lax.rsqrt(jnp.mean(xs * xs, axis=axes, keepdims=True) + epsilon)
    return (xs * inv_rms * scale.astype(xs.dtype)).astype(x.dtype)


def _group_stats(x, num_groups, epsilon, dtype):
    n, c = x.shape[:2]
    grouped = x.astype(dtype).reshape((n, num_groups, -1))
    mean = jnp.mean(grouped, axis=-1, keepdims=True)
    var = jnp.var(grouped, axis=-1, keepdims=True)
    return ((grouped - mean) / jnp.sqrt(var + epsilon)).reshape(x.shape)


@register("GroupNormalization", 18)
def group_norm_18(x, scale, bias, *, num_groups, epsilon):
    # Opset 18: scale and bias have one value per group.
    normed = _group_stats(x, num_groups, epsilon, x.dtype)
    per_group = x.shape[1] // num_groups
    scale = jnp.repeat(scale, per_group)
    bias = jnp.repeat(bias, per_group)
    return (normed * _channel_param(scale, x.ndim) + _channel_param(bias, x.ndim)).astype(x.dtype)


@register("GroupNormalization", 21)
def group_norm_21(x, scale, bias, *, num_groups, epsilon, stash_type):
    # Opset 21: scale and bias have one value per channel.
    normed = _group_stats(x, num_groups, epsilon, _stash_dtype(x, stash_type)).astype(x.dtype)
    return (normed * _channel_param(scale, x.ndim) + _channel_param(bias, x.ndim)).astype(x.dtype)


@register("LpNormalization", 1, 22)
def lp_norm(x, *, axis, p):
    if p == 1:
        norm = jnp.sum(jnp.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    else:
        raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
    safe = jnp.where(norm == 0, jnp.ones_like(norm), norm)
    return jnp.where(norm == 0, jnp.zeros_like(x), x / safe).astype(x.dtype)


@register("LRN", 1, 13)
def lrn(x, *, size, alpha, beta, bias):
    # Channel c sums squares over [c - floor((size-1)/2), c + ceil((size-1)/2)],
    # clipped to the valid channels: a window sum over a zero-padded axis 1.
    before = (size - 1) // 2
    after = size - 1 - before
    padding = [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2)
    window = (1, size) + (1,) * (x.ndim - 2)
    square_sum = jax.lax.reduce_window(
        x * x, jnp.array(0, x.dtype), jax.lax.add, window, (1,) * x.ndim, padding
    )
    return (x / (bias + (alpha / size) * square_sum) ** beta).astype(x.dtype)


@register("MeanVarianceNormalization", 9, 13)
def mean_variance_norm(x, *, axes):
    axes = tuple(int(a) for a in axes)
    mean = jnp.mean(x, axis=axes, keepdims=True)
    # The spec writes E[x^2] - E[x]^2; the two-pass form is the same value
    # without float32 cancellation (as onnxruntime computes it).
    var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
    return ((x - mean) / (jnp.sqrt(var) + 1e-9)).astype(x.dtype)
