"""Loss ops: NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register
from onnx2jax.ops.softmax import stable_log_softmax


def _nll(log_prob, target, weight, reduction, ignore_index):
    """ONNX's NLL over ``log_prob`` (N, C, d1, ...) and ``target`` (N, d1, ...).

    loss[n, d] = -log_prob[n, target[n, d], d] * w[n, d], with w = weight[target] (1
    without weights) and 0 where target == ignore_index. "mean" divides by sum(w)
    when weights or ignore_index are given, else by the element count.
    """
    log_prob, target = jnp.asarray(log_prob), jnp.asarray(target)
    classes = log_prob.shape[1]
    valid = None if ignore_index is None else target != ignore_index
    safe = jnp.clip(target, 0, classes - 1)  # ignored entries may hold any index
    picked = jnp.take_along_axis(log_prob, jnp.expand_dims(safe, 1).astype(jnp.int32), axis=1)
    loss = -jnp.squeeze(picked, 1)
    w = None
    if weight is not None:
        w = jnp.take(jnp.asarray(weight), safe, axis=0)
    if valid is not None:
        w = jnp.where(valid, jnp.ones((), log_prob.dtype) if w is None else w, jnp.zeros((), log_prob.dtype))
    if w is not None:
        loss = loss * w
    if reduction == "none":
        return loss
    if reduction == "sum":
        return jnp.sum(loss)
    if reduction == "mean":
        if w is None:
            return jnp.mean(loss)
        return (jnp.sum(loss) / jnp.sum(w)).astype(log_prob.dtype)
    raise ValueError(f"reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


@register("NegativeLogLikelihoodLoss", 12, 13, 22)
def negative_log_likelihood_loss(input, target, weight=None, *, reduction, ignore_index=None):  # noqa: A002
    return _nll(input, target, weight, reduction, ignore_index)


@register("SoftmaxCrossEntropyLoss", 12, 13)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, reduction, ignore_index=None):
    log_prob = stable_log_softmax(scores, axis=1)
    return _nll(log_prob, labels, weights, reduction, ignore_index), log_prob
