"""Dropout, every schema version.

In inference (the default since opset 7, and whenever opset 12's
``training_mode`` input is absent or false) Dropout returns its input and an
all-True mask. In training mode it keeps each element with probability
``1 - ratio`` and scales the kept ones by ``1 / (1 - ratio)``. The random draw
uses ``jax.random`` with a key made from the ``seed`` attribute, or the fixed
key 0 when there is none: it is a constant of the traced program, so every
call of a jitted model drops the same elements (and they differ from
onnxruntime's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _is_static(value) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def _keep_mask(shape, ratio, seed):
    draw = jax.random.uniform(jax.random.key(0 if seed is None else int(seed)), tuple(shape), dtype=jnp.float32)
    return draw >= jnp.asarray(ratio, jnp.float32)


def _drop(x, ratio, seed):
    """Training-mode dropout: (output, keep mask)."""
    keep = _keep_mask(x.shape, ratio, seed)
    scale = 1.0 / (1.0 - jnp.asarray(ratio, jnp.float32))
    # where, not a product: ratio 1 makes the scale infinite, and 0 * inf is NaN.
    y = jnp.where(keep, x * scale.astype(x.dtype), jnp.zeros((), x.dtype))
    return y, keep


@register("Dropout", 1, 6)
def dropout_1(x, *, is_test=0, ratio=0.5, consumed_inputs=None):
    # Opsets 1 and 6: training mode unless is_test; the mask has the input's type.
    if is_test or ratio == 0:
        return x, np.ones(x.shape, dtype=x.dtype)
    y, keep = _drop(x, ratio, None)
    return y, keep.astype(x.dtype)


@register("Dropout", 7)
def dropout_7(x, *, ratio=0.5):
    return x, np.ones(x.shape, dtype=x.dtype)


@register("Dropout", 10)
def dropout_10(x, *, ratio=0.5):
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
