"""What the ``ai.onnx.ml`` op families share: score transforms, labels, matrices.

The domain's spec leaves much to the runtime, and exporters (skl2onnx,
onnxmltools) target onnxruntime, so these follow onnxruntime's CPU kernels
(``onnxruntime/core/providers/cpu/ml``) where the spec is silent: scores are
float32 whatever the input type, LOGISTIC is written ``1 / (1 + exp(-|v|))``
mirrored for negative ``v``, PROBIT uses the same closed-form inverse error
function, SOFTMAX_ZERO leaves exact zeros out of the sum.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.hostvalues import StringLabels

ML = "ai.onnx.ml"

_SQRT2 = np.float32(1.41421356)


def as_matrix(x, op: str, dtype=jnp.float32) -> jax.Array:
    """``x`` as a [N, F] matrix in ``dtype``: a vector is one row (onnxruntime's reading)."""
    x = jnp.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"{op} takes a [N, F] matrix or a [F] vector, got shape {x.shape}")
    return x.astype(dtype)


def logistic(v: jax.Array) -> jax.Array:
    """onnxruntime's ComputeLogistic: ``1 / (1 + exp(-|v|))``, ``1 -`` that for negative ``v``."""
    p = 1 / (1 + jnp.exp(-jnp.abs(v)))
    return jnp.where(v < 0, 1 - p, p)


def _erf_inv(x: jax.Array) -> jax.Array:
    # Winitzki's approximation with a = 0.147, as onnxruntime's ErfInv (not jax's exact erfinv).
    sign = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
    log = jnp.log((1 - x) * (1 + x))
    v = 2 / (np.float32(np.pi) * np.float32(0.147)) + 0.5 * log
    v2 = 1 / np.float32(0.147) * log
    return sign * jnp.sqrt(-v + jnp.sqrt(v * v - v2))


def probit(v: jax.Array) -> jax.Array:
    """onnxruntime's ComputeProbit: ``sqrt(2) * erfinv(2v - 1)``."""
    return _SQRT2 * _erf_inv(2 * v - 1)


def softmax_zero(scores: jax.Array) -> jax.Array:
    """Softmax over the last axis that leaves scores within 1e-7 of zero out of the sum (they stay ~0)."""
    top = jnp.max(scores, axis=-1, keepdims=True)
    nonzero = jnp.abs(scores) > 1e-7
    exps = jnp.where(nonzero, jnp.exp(scores - top), scores * jnp.exp(-top))
    total = jnp.sum(jnp.where(nonzero, exps, 0), axis=-1, keepdims=True)
    return exps / total


def post_transform(scores: jax.Array, transform: str) -> jax.Array:
    """A classifier's or regressor's ``post_transform`` on a [N, C] score matrix (C >= 2)."""
    if transform == "NONE":
        return scores
    if transform == "LOGISTIC":
        return logistic(scores)
    if transform == "SOFTMAX":
        return jax.nn.softmax(scores, axis=-1)
    if transform == "SOFTMAX_ZERO":
        return softmax_zero(scores)
    if transform == "PROBIT":
        return probit(scores)
    raise ValueError(f"unknown post_transform {transform!r}")


def is_traced(x) -> bool:
    """Whether ``x`` is a tracer (its values unknown until the program runs)."""
    return isinstance(x, jax.core.Tracer)


def pick_labels(index, labels: Sequence):
    """``labels[index]``: int64 labels as an array, string labels as strings.

    Strings exist only on the host: with a traced index the result is a
    :class:`~onnx2jax.hostvalues.StringLabels` that calling the model
    finishes; with a known index, a numpy object array.
    """
    if labels and isinstance(labels[0], str):
        if is_traced(index):
            return StringLabels(tuple(labels), index)
        return np.array(labels, dtype=object)[np.asarray(index)]
    return jnp.asarray(np.asarray(labels, dtype=np.int64))[index]


def class_labels(ints: Sequence[int] | None, strings: Sequence[str] | None, op: str) -> tuple:
    """The class labels of a classifier: its int64 labels or its string labels, exactly one of them."""
    if ints and strings:
        raise ValueError(f"{op} has both int64 and string class labels")
    labels = tuple(ints or strings or ())
    if not labels:
        raise ValueError(f"{op} has no class labels")
    return labels
