"""Dropout, every schema version.

In inference (the default since opset 7, and whenever opset 12's
``training_mode`` input is absent or false) Dropout returns its input and an
all-True mask. In training mode it keeps each element with probability
``1 - ratio`` and scales the kept ones by ``1 / (1 - ratio)``.

The draw is ONNX's reference draw: numpy's ``RandomState(seed).uniform(0, 1,
shape)`` with the ``seed`` attribute (taken modulo 2**32, numpy's seed range),
or seed 0 when there is none, made on the host while tracing. It is a constant
of the traced program (as large as the input), so every call of a jitted model
drops the same elements, the ones ONNX's reference evaluator drops with that
seed; onnxruntime's generator drops others.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _is_static(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def _reference_draw(shape, seed) -> np.ndarray:
    """ONNX's reference draw for Dropout: numpy's legacy generator seeded with ``seed`` (float64 in [0, 1))."""
    return np.random.RandomState(0 if seed is None else int(seed) % 2**32).uniform(0.0, 1.0, tuple(shape))


def _rounded_down(values: np.ndarray, dtype) -> np.ndarray:
    """``values`` in ``dtype``, each the largest ``dtype`` number not above it.

    Then ``rounded >= r`` exactly when ``values >= r`` for any ``r`` of ``dtype``:
    the float64 draw compares with a float32 ratio as numpy compares them.
    """
    rounded = values.astype(dtype)
    above = rounded.astype(np.float64) > values
    rounded[above] = np.nextafter(rounded[above], np.asarray(-np.inf, dtype))
    return rounded


def _keep_mask(shape, ratio, seed):
    draw = _reference_draw(shape, seed)
    if _is_static(ratio):
        return draw >= np.float64(ratio)
    ratio = jnp.asarray(ratio)
    return jnp.asarray(_rounded_down(draw, np.dtype(ratio.dtype))) >= ratio


def _drop(x, ratio, seed):
    """Training-mode dropout: (output, keep mask)."""
    keep = _keep_mask(x.shape, ratio, seed)
    scale = 1.0 / (1.0 - jnp.asarray(ratio, jnp.float32))
    # where, not a product: ratio 1 makes the scale infinite, and 0 * inf is NaN.
    y = jnp.where(keep, x * scale.astype(x.dtype), jnp.zeros((), x.dtype))
    return y, keep


@register("Dropout", 1, 6)
def dropout_1(x, *, is_test, ratio, consumed_inputs=None):
    # Opsets 1 and 6: training mode unless is_test; the mask has the input's type.
    if is_test or ratio == 0:
        return x, np.ones(x.shape, dtype=x.dtype)
    y, keep = _drop(x, ratio, None)
    return y, keep.astype(x.dtype)


@register("Dropout", 7)
def dropout_7(x, *, ratio):
    return x, np.ones(x.shape, dtype=x.dtype)


@register("Dropout", 10)
def dropout_10(x, *, ratio):
    return x, np.ones(x.shape, dtype=np.bool_)


@register("Dropout", 12, 13, 22)
def dropout(x, ratio=None, training_mode=None, *, seed=None):
    inference = (x, np.ones(x.shape, dtype=np.bool_))
    if training_mode is None or (_is_static(training_mode) and not bool(training_mode)):
        return inference
    ratio = np.float32(0.5) if ratio is None else ratio
    if _is_static(ratio) and float(ratio) == 0.0:
        return inference
    y, keep = _drop(x, ratio, seed)
    if _is_static(training_mode):
        return y, keep
    training = jnp.asarray(training_mode, jnp.bool_)
    return jnp.where(training, y, x), jnp.where(training, keep, True)
