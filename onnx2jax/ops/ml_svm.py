"""ai.onnx.ml support vector machines: SVMClassifier, SVMRegressor.

libsvm's models as array code, in float32 as onnxruntime computes them. A
classifier with support vectors is one-vs-one: each pair of classes (i, j),
in the order (0, 1), (0, 2), ..., (1, 2), ... scores
``sum_{v in i} coef[j-1, v] K(x, v) + sum_{v in j} coef[i, v] K(x, v) + rho``
(all pairs at once: one matrix of per-pair weights over the support vectors),
and each pair votes for i when its score is > 0; the label is the class with
the most votes. With ``prob_a``/``prob_b`` the pair scores become Platt
probabilities, coupled into class probabilities by libsvm's iterative method
(Wu, Lin and Weng 2004), run for every row at once with a per-row stop.
Without support vectors the model is liblinear's: ``X @ coef.T + rho[0]``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops import ml_common
from onnx2jax.ops.ml_common import ML, as_matrix, class_labels, logistic, pick_labels, probit
from onnx2jax.ops.registry import register


def _kernel(x, vectors: np.ndarray, kernel_type: str, kernel_params, bias: float = 0.0):
    """[N, V] kernel values of the rows of ``x`` against ``vectors``; ``bias`` is added for LINEAR."""
    gamma, coef0, degree = (tuple(kernel_params) + (0.0, 0.0, 0.0))[:3] if kernel_params else (0.0, 0.0, 0.0)
    if kernel_type == "RBF":
        squared = jnp.sum((x[:, None, :] - vectors[None, :, :]) ** 2, axis=-1)
        return jnp.exp(-np.float32(gamma) * squared)
    if kernel_type == "LINEAR":
        return x @ vectors.T + np.float32(bias)
    dot = np.float32(gamma) * (x @ vectors.T) + np.float32(coef0)
    if kernel_type == "POLY":
        return dot ** int(degree) if float(degree).is_integer() else dot ** np.float32(degree)
    if kernel_type == "SIGMOID":
        return jnp.tanh(dot)
    raise ValueError(f"unknown kernel_type {kernel_type!r}")


def _pair_weights(coefficients: np.ndarray, vectors_per_class) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """[P, V]: each one-vs-one pair's weights over all support vectors (zero outside the pair's classes)."""
    counts = np.asarray(vectors_per_class, np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    n_classes, n_vectors = len(counts), int(counts.sum())
    coefficients = coefficients.reshape(n_classes - 1, n_vectors)
    pairs = [(i, j) for i in range(n_classes - 1) for j in range(i + 1, n_classes)]
    weights = np.zeros((len(pairs), n_vectors), np.float32)
    for p, (i, j) in enumerate(pairs):
        own_i = slice(starts[i], starts[i] + counts[i])
        own_j = slice(starts[j], starts[j] + counts[j])
        weights[p, own_i] = coefficients[j - 1, own_i]
        weights[p, own_j] = coefficients[i, own_j]
    return weights, pairs


def _couple(pair_probabilities, pairs: list[tuple[int, int]], n_classes: int):
    """libsvm's multiclass_probability for each row: class probabilities from pairwise ones."""
    n = pair_probabilities.shape[0]
    r = jnp.zeros((n, n_classes, n_classes), jnp.float32)
    for p, (i, j) in enumerate(pairs):
        r = r.at[:, i, j].set(pair_probabilities[:, p]).at[:, j, i].set(1 - pair_probabilities[:, p])
    eye = jnp.eye(n_classes, dtype=bool)
    q = jnp.where(eye, jnp.sum(r * r, axis=1)[:, None, :] * eye, -r * jnp.swapaxes(r, 1, 2))
    eps = np.float32(0.005 / n_classes)

    def iteration(_, state):
        prob, done = state
        qp = jnp.einsum("nij,nj->ni", q, prob)
        pqp = jnp.sum(prob * qp, axis=1)
        done = done | (jnp.max(jnp.abs(qp - pqp[:, None]), axis=1) < eps)
        new_prob = prob
        for i in range(n_classes):  # the sweep is sequential in i, as libsvm's
            diff = (-qp[:, i] + pqp) / q[:, i, i]
            new_prob = new_prob.at[:, i].add(diff)
            pqp = (pqp + diff * (diff * q[:, i, i] + 2 * qp[:, i])) / (1 + diff) / (1 + diff)
            qp = (qp + diff[:, None] * q[:, i, :]) / (1 + diff)[:, None]
            new_prob = new_prob / (1 + diff)[:, None]
        return jnp.where(done[:, None], prob, new_prob), done

    start = jnp.full((n, n_classes), 1 / n_classes, jnp.float32)
    prob, _ = jax.lax.fori_loop(0, 100, iteration, (start, jnp.zeros(n, bool)))
    return prob


@register("SVMClassifier", 1, domain=ML)
def svm_classifier(
    x, *, coefficients=None, rho=None, classlabels_ints=None, classlabels_strings=None, kernel_type,
    kernel_params=None, post_transform, prob_a=None, prob_b=None, support_vectors=None, vectors_per_class=None,
):
    """(labels [N], scores) of a libsvm (one-vs-one) or liblinear model, as onnxruntime computes them.

    Scores: class probabilities [N, C] with ``prob_a``; otherwise the pair
    scores [N, C(C-1)/2], and for two classes ``[-s, s]`` (NONE),
    ``[logistic(-s), logistic(s)]`` (LOGISTIC) or ``[1 - s, s]`` (SOFTMAX, SOFTMAX_ZERO).
    """
    labels = class_labels(classlabels_ints, classlabels_strings, "SVMClassifier")
    n_classes = len(labels)
    x = as_matrix(x, "SVMClassifier")
    coefficients = np.asarray(coefficients, np.float32)
    rho = np.asarray(rho, np.float32)
    if not vectors_per_class or not sum(vectors_per_class):  # liblinear
        scores = x @ coefficients.reshape(n_classes, -1).T + rho[0]
        index = jnp.argmax(scores, axis=1)
        if n_classes == 2:
            top = jnp.max(scores, axis=1)
            positive = (top >= 0.5) if (coefficients >= 0).all() else (top > 0)
            index = jnp.where(positive, 1, index)
        return pick_labels(index, labels), ml_common.post_transform(scores, post_transform) if n_classes > 1 else scores
    vectors = np.asarray(support_vectors, np.float32).reshape(int(sum(vectors_per_class)), -1)
    weights, pairs = _pair_weights(coefficients, vectors_per_class)
    pair_scores = _kernel(x, vectors, kernel_type, kernel_params) @ weights.T + rho[: len(pairs)]
    winners = jnp.stack([jnp.where(pair_scores[:, p] > 0, i, j) for p, (i, j) in enumerate(pairs)], axis=1)
    votes = jnp.sum(winners[:, :, None] == jnp.arange(n_classes), axis=1)
    label = pick_labels(jnp.argmax(votes, axis=1), labels)
    if prob_a:
        a, b = np.asarray(prob_a, np.float32), np.asarray(prob_b, np.float32)
        pair_probabilities = jnp.clip(1 - logistic(pair_scores * a + b), 1e-7, 1 - 1e-7)
        return label, ml_common.post_transform(_couple(pair_probabilities, pairs, n_classes), post_transform)
    if n_classes > 2:
        return label, ml_common.post_transform(pair_scores, post_transform)
    s = pair_scores
    if post_transform == "PROBIT":
        raise NotImplementedError("SVMClassifier: PROBIT on a two-class model has no defined score layout")
    if post_transform == "LOGISTIC":
        return label, jnp.concatenate([logistic(-s), logistic(s)], axis=1)
    return label, jnp.concatenate([-s, s] if post_transform == "NONE" else [1 - s, s], axis=1)


@register("SVMRegressor", 1, domain=ML)
def svm_regressor(
    x, *, coefficients=None, rho=None, kernel_type, kernel_params=None, n_supports, one_class,
    post_transform, support_vectors=None,
):
    """[N, 1] float32: ``sum_v coef[v] K(x, v) + rho``, or liblinear's ``x @ coef + rho`` without support vectors."""
    x = as_matrix(x, "SVMRegressor")
    coefficients = np.asarray(coefficients, np.float32)
    rho = np.float32(rho[0] if rho else 0.0)
    if n_supports:
        vectors = np.asarray(support_vectors, np.float32).reshape(int(n_supports), -1)
        scores = _kernel(x, vectors, kernel_type, kernel_params) @ coefficients[:, None] + rho
    else:
        scores = x @ coefficients[:, None] + rho
    if one_class:
        scores = jnp.where(scores > 0, 1.0, -1.0).astype(jnp.float32)
    return probit(scores) if post_transform == "PROBIT" else scores
