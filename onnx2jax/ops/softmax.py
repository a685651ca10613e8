"""Softmax, LogSoftmax, Hardmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _coerced_2d(fn, x, axis):
    """Opset 1/11 semantics: view ``x`` as 2-D (dims before ``axis`` x dims from ``axis``), apply along rows.

    A (2, 3, 4) input with axis=1 becomes (2, 12): each row of 12 is normalised as one.
    """
    x = jnp.asarray(x)
    axis = axis + x.ndim if axis < 0 else axis
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return fn(x.reshape(rows, -1), 1).reshape(x.shape)


def shifted_by_max(x, axis, keepdims_max=None):
    """``x - max(x)`` along ``axis``, guaranteed <= 0 and exactly 0 at a maximum.

    Every exp-normalisation (Softmax, LogSoftmax, log-sum-exp, attention) relies
    on that guarantee, and XLA CPU breaks it for plain ``x - max(x)``: when ``x``
    is an elementwise product (a mean's ``sum * (1/n)``), XLA duplicates the
    multiply into the fusion that takes the max and the one that subtracts, and
    LLVM contracts the second into a fused multiply-add, so it subtracts the
    rounded max from the *unrounded* product. The difference is up to half an
    ulp of ``x``: over 88 once ``|x|`` exceeds about 1.5e9, and ``exp`` then
    overflows to inf (or every term underflows to 0) and the result is NaN
    (docs/known-issues.md). Clamping ``x`` at the max first makes the subtraction
    read a rounded value (a select cannot be contracted) and costs one compare.

    ``jnp.where(x > m, m, x)`` rather than ``jnp.minimum``: a NaN stays NaN, and
    the gradient flows to ``x`` at ties too (``minimum`` splits it in half).

    Returns:
      (shifted, max) with the max keeping the reduced axis (gradient stopped).
    """
    x = jnp.asarray(x)
    m = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    return jnp.where(x > m, m, x) - m, m


def stable_softmax(x, axis):
    """Softmax along ``axis`` (jax.nn.softmax's values) that no FMA contraction can turn into NaN."""
    shifted, _ = shifted_by_max(x, axis)
    e = jnp.exp(shifted)
    return e / jnp.sum(e, axis=axis, keepdims=True)


def stable_log_softmax(x, axis):
    """LogSoftmax along ``axis``; see :func:`shifted_by_max`."""
    shifted, _ = shifted_by_max(x, axis)
    return shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True))


def stable_logsumexp(x, axis, keepdims):
    """log(sum(exp(x))) over ``axis`` (an int, a tuple or None for all); see :func:`shifted_by_max`."""
    x = jnp.asarray(x)
    axis = tuple(range(x.ndim)) if axis is None else axis
    shifted, m = shifted_by_max(x, axis)
    finite_max = jnp.where(jnp.isfinite(m), m, jnp.zeros_like(m))
    shifted = jnp.where(jnp.isfinite(m), shifted, x - finite_max)
    out = jnp.log(jnp.sum(jnp.exp(shifted), axis=axis, keepdims=True)) + finite_max
    return out if keepdims else jnp.squeeze(out, axis=axis)


def _softmax(x, axis):
    return stable_softmax(x, axis)


def _log_softmax(x, axis):
    return stable_log_softmax(x, axis)


def _hardmax(x, axis):
    # One-hot of the first maximum along the axis.
    x = jnp.asarray(x)
    index = jnp.argmax(x, axis=axis, keepdims=True)
    positions = jax.lax.broadcasted_iota(index.dtype, x.shape, axis % x.ndim)
    return (positions == index).astype(x.dtype)


@register("Softmax", 1, 11)
def softmax_2d(x, *, axis):
    return _coerced_2d(_softmax, x, axis)


@register("Softmax", 13)
def softmax(x, *, axis):
    return _softmax(x, axis)


@register("LogSoftmax", 1, 11)
def log_softmax_2d(x, *, axis):
    return _coerced_2d(_log_softmax, x, axis)


@register("LogSoftmax", 13)
def log_softmax(x, *, axis):
    return _log_softmax(x, axis)


@register("Hardmax", 1, 11)
def hardmax_2d(x, *, axis):
    return _coerced_2d(_hardmax, x, axis)


@register("Hardmax", 13)
def hardmax(x, *, axis):
    return _hardmax(x, axis)
