"""ai.onnx.ml linear models: LinearClassifier, LinearRegressor.

Both are ``scores = X @ coefficients.T + intercepts`` in float32 (as
onnxruntime computes them, whatever the input type), differentiable in X.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.ml_common import ML, as_matrix, class_labels, pick_labels, post_transform, probit
from onnx2jax.ops.registry import register


def _affine(x, coefficients, intercepts, op: str):
    x = as_matrix(x, op)
    features = x.shape[1]
    coefficients = np.asarray(coefficients, dtype=np.float32)
    if coefficients.size % features:
        raise ValueError(f"{op}: {coefficients.size} coefficients do not split into rows of {features} features")
    weights = coefficients.reshape(-1, features)
    bias = np.zeros(weights.shape[0], np.float32) if not intercepts else np.asarray(intercepts, np.float32)
    if bias.shape[0] != weights.shape[0]:
        raise ValueError(f"{op}: {bias.shape[0]} intercepts for {weights.shape[0]} rows of coefficients")
    return x @ weights.T + bias


@register("LinearClassifier", 1, domain=ML)
def linear_classifier(
    x, *, coefficients, classlabels_ints=None, classlabels_strings=None, intercepts=None, multi_class,
    post_transform,
):
    """Labels and scores of a linear classifier, as onnxruntime computes them.

    One row of coefficients with two class labels is a binary model: the
    label is the second class where the raw score is > 0, and the scores
    become ``[1 - s, s]`` (onnxruntime's layout; the post_transform is not
    applied in that case, also as onnxruntime does).
    """
    del multi_class  # onnxruntime ignores it too
    labels = class_labels(classlabels_ints, classlabels_strings, "LinearClassifier")
    scores = _affine(x, coefficients, intercepts, "LinearClassifier")
    if scores.shape[1] == 1:
        binary = labels if len(labels) == 2 else (("0", "1") if isinstance(labels[0], str) else (0, 1))
        label = pick_labels((scores[:, 0] > 0).astype(jnp.int32), binary)
        if len(labels) == 2:
            if post_transform == "PROBIT":
                raise NotImplementedError("LinearClassifier: PROBIT on a one-row binary model has no defined score layout")
            return label, jnp.concatenate([1 - scores, scores], axis=1)
        return label, probit(scores) if post_transform == "PROBIT" else scores
    if len(labels) != scores.shape[1]:
        raise ValueError(f"LinearClassifier: {len(labels)} class labels for {scores.shape[1]} rows of coefficients")
    label = pick_labels(jnp.argmax(scores, axis=1), labels)
    return label, _transform(scores, post_transform)


def _transform(scores, transform: str):
    if scores.shape[1] == 1:  # one target: onnxruntime applies only PROBIT
        return probit(scores) if transform == "PROBIT" else scores
    return post_transform(scores, transform)


@register("LinearRegressor", 1, domain=ML)
def linear_regressor(x, *, coefficients=None, intercepts=None, targets, post_transform):
    """``X @ coefficients.T + intercepts`` for ``targets`` outputs, then the post_transform."""
    scores = _affine(x, coefficients, intercepts, "LinearRegressor")
    if scores.shape[1] != targets:
        raise ValueError(f"LinearRegressor: coefficients give {scores.shape[1]} targets, the node says {targets}")
    return _transform(scores, post_transform)
