"""ai.onnx.ml feature preprocessing: Scaler, Normalizer, Binarizer, Imputer,
ArrayFeatureExtractor, FeatureVectorizer.

Elementwise array code, jittable and differentiable where the op is; float
outputs are float32 as onnxruntime makes them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.hostvalues import StringLabels
from onnx2jax.ops.ml_common import ML, is_traced
from onnx2jax.ops.registry import register


@register("Scaler", 1, domain=ML)
def scaler(x, *, offset=None, scale=None):
    """``(x - offset) * scale`` in float32; ``offset``/``scale`` hold one value or one per feature."""
    x = jnp.asarray(x).astype(jnp.float32)
    offset = np.asarray(offset if offset else (0.0,), np.float32)
    scale = np.asarray(scale if scale else (1.0,), np.float32)
    for name, values in (("offset", offset), ("scale", scale)):
        if values.size not in (1, x.shape[-1]):
            raise ValueError(f"Scaler: {values.size} {name} values for {x.shape[-1]} features")
    return (x - offset) * scale


@register("Normalizer", 1, domain=ML)
def normalizer(x, *, norm):
    """Each row divided by its max, L1 or L2 norm (onnxruntime: a row whose norm is 0 is kept as it is)."""
    x = jnp.asarray(x).astype(jnp.float32)
    if x.ndim not in (1, 2):
        raise ValueError(f"Normalizer takes a [N, F] matrix or a [F] vector, got shape {x.shape}")
    if norm == "MAX":
        total = jnp.max(x, axis=-1, keepdims=True)
    elif norm == "L1":
        total = jnp.sum(jnp.abs(x), axis=-1, keepdims=True)
    elif norm == "L2":
        total = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
    else:
        raise ValueError(f"Normalizer: unknown norm {norm!r}")
    return jnp.where(total != 0, x / jnp.where(total != 0, total, 1), x)


@register("Binarizer", 1, domain=ML)
def binarizer(x, *, threshold):
    """1 where ``x > threshold``, else 0, in ``x``'s dtype (NaN gives 0)."""
    x = jnp.asarray(x)
    return (x > threshold).astype(x.dtype)


@register("Imputer", 1, domain=ML)
def imputer(
    x, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float, replaced_value_int64
):
    """Replaces ``replaced_value`` (NaN matches NaN) in each column by that column's imputed value."""
    x = jnp.asarray(x)
    if imputed_value_floats:
        values, replaced = np.asarray(imputed_value_floats, np.float32), replaced_value_float
    elif imputed_value_int64s:
        values, replaced = np.asarray(imputed_value_int64s, np.int64), replaced_value_int64
    else:
        raise ValueError("Imputer has no imputed values")
    if values.size not in (1, x.shape[-1]):
        raise ValueError(f"Imputer: {values.size} imputed values for {x.shape[-1]} columns")
    missing = jnp.isnan(x) if np.isnan(replaced) else x == replaced
    return jnp.where(missing, values.astype(x.dtype), x)


@register("ArrayFeatureExtractor", 1, domain=ML)
def array_feature_extractor(x, indices):
    """``x[..., indices]`` with the indices flattened; a vector ``x`` gives one row.

    String tables with a run-time index (skl2onnx picks class names this way)
    give a :class:`~onnx2jax.hostvalues.StringLabels`. Known indices are
    checked against the last axis; run-time ones are used as they come (an
    out-of-range one is clamped, as any jax gather).
    """
    index = jnp.reshape(indices, (-1,)) if is_traced(indices) else np.asarray(indices).reshape(-1)
    if isinstance(x, np.ndarray) and x.dtype.kind in "OUS":
        if x.ndim != 1:
            raise NotImplementedError("ArrayFeatureExtractor picks run-time strings only from a 1-D table")
        strings = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in x]
        if is_traced(index):
            return StringLabels(tuple(strings), index[None, :])
        return np.array(strings, dtype=object)[index][None, :]
    x = jnp.asarray(x)
    if not is_traced(index) and index.size and (index.min() < -x.shape[-1] or index.max() >= x.shape[-1]):
        raise IndexError(f"ArrayFeatureExtractor: indices {index.tolist()} out of range for {x.shape[-1]} columns")
    out = jnp.take(x, index, axis=-1)
    return out[None, :] if x.ndim == 1 else out


@register("FeatureVectorizer", 1, domain=ML)
def feature_vectorizer(*inputs, inputdimensions=None):
    """Concatenates the inputs' columns as float32, each cut or zero-padded to its ``inputdimensions``."""
    dims = list(inputdimensions or ())
    if len(dims) != len(inputs):
        raise ValueError(f"FeatureVectorizer: {len(inputs)} inputs but {len(dims)} inputdimensions")
    columns = []
    for x, width in zip(inputs, dims):
        x = jnp.asarray(x).astype(jnp.float32)
        x = x.reshape(-1, 1) if x.ndim == 1 else x
        if x.ndim != 2:
            raise ValueError(f"FeatureVectorizer takes 1-D or 2-D inputs, got shape {x.shape}")
        x = x[:, :width] if x.shape[1] >= width else jnp.pad(x, ((0, 0), (0, width - x.shape[1])))
        columns.append(x)
    return jnp.concatenate(columns, axis=1)
