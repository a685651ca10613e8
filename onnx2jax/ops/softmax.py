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


def _softmax(x, axis):
    return jax.nn.softmax(x, axis=axis)


def _log_softmax(x, axis):
    return jax.nn.log_softmax(x, axis=axis)


def _hardmax(x, axis):
    # One-hot of the first maximum along the axis.
    x = jnp.asarray(x)
    index = jnp.argmax(x, axis=axis, keepdims=True)
    positions = jax.lax.broadcasted_iota(index.dtype, x.shape, axis % x.ndim)
    return (positions == index).astype(x.dtype)


@register("Softmax", 1, 11)
def softmax_2d(x, *, axis=1):
    return _coerced_2d(_softmax, x, axis)


@register("Softmax", 13)
def softmax(x, *, axis=-1):
    return _softmax(x, axis)


@register("LogSoftmax", 1, 11)
def log_softmax_2d(x, *, axis=1):
    return _coerced_2d(_log_softmax, x, axis)


@register("LogSoftmax", 13)
def log_softmax(x, *, axis=-1):
    return _log_softmax(x, axis)


@register("Hardmax", 1, 11)
def hardmax_2d(x, *, axis=1):
    return _coerced_2d(_hardmax, x, axis)


@register("Hardmax", 13)
def hardmax(x, *, axis=-1):
    return _hardmax(x, axis)
