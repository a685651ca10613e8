"""Optimizer steps from the ai.onnx.preview.training domain: Adagrad, Adam, Momentum.

Each takes the learning rate R and step count T, then N tensors to optimize,
their N gradients and their optimizer states (grouped by kind), and returns
the updated tensors followed by the updated states, in the same order.
"""

from __future__ import annotations

import jax.numpy as jnp

from onnx2jax.ops.registry import register

_DOMAIN = "ai.onnx.preview.training"


def _groups(data, kinds: int):
    """Splits [X1..Xn, G1..Gn, S1..Sn, ...] into ``kinds`` lists of n tensors."""
    if len(data) % kinds:
        raise ValueError(f"expected a multiple of {kinds} tensors after R and T, got {len(data)}")
    n = len(data) // kinds
    return [data[k * n : (k + 1) * n] for k in range(kinds)]


@register("Adagrad", 1, domain=_DOMAIN)
def adagrad(r, t, *data, decay_factor, epsilon, norm_coefficient):
    xs, gs, hs = _groups(data, 3)
    rate = r / (1 + t * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g = norm_coefficient * x + g
        h2 = h + g * g
        new_x.append((x - rate * g / (jnp.sqrt(h2) + epsilon)).astype(jnp.asarray(x).dtype))
        new_h.append(h2.astype(jnp.asarray(h).dtype))
    return (*new_x, *new_h)


@register("Adam", 1, domain=_DOMAIN)
def adam(r, t, *data, alpha, beta, epsilon, norm_coefficient, norm_coefficient_post):
    xs, gs, vs, hs = _groups(data, 4)
    t = jnp.asarray(t)
    rate = jnp.where(t > 0, r * jnp.sqrt(1 - beta**t) / (1 - alpha**t), r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g = norm_coefficient * x + g
        v2 = alpha * v + (1 - alpha) * g
        h2 = beta * h + (1 - beta) * g * g
        x2 = (1 - norm_coefficient_post) * (x - rate * (v2 / (jnp.sqrt(h2) + epsilon)))
        new_x.append(x2.astype(jnp.asarray(x).dtype))
        new_v.append(v2.astype(jnp.asarray(v).dtype))
        new_h.append(h2.astype(jnp.asarray(h).dtype))
    return (*new_x, *new_v, *new_h)


@register("Momentum", 1, domain=_DOMAIN)
def momentum(r, t, *data, alpha, beta, mode, norm_coefficient):
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _groups(data, 3)
    beta_t = jnp.where(jnp.asarray(t) > 0, beta, 1.0)
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g = norm_coefficient * x + g
        v2 = alpha * v + beta_t * g
        step = g + alpha * v2 if mode == "nesterov" else v2
        new_x.append((x - r * step).astype(jnp.asarray(x).dtype))
        new_v.append(v2.astype(jnp.asarray(v).dtype))
    return (*new_x, *new_v)
