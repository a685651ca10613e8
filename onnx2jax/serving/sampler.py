"""Choosing each slot's next token with that slot's own sampling parameters, all of them data.

Unlike :func:`onnx2jax.runtime.sampling.choose` (one setting for the whole batch, greedy-or-sampled compiled in),
every row here has its own temperature (0: greedy), top-k, top-p, repetition penalty and seed, so requests with
different parameters share one compiled program. A row's random key is ``fold_in(PRNGKey(seed), n)`` with n the
number of tokens the request has generated: the same seed gives the same tokens whatever runs beside it, and
after a preemption.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.runtime.sampling import first_max, penalize


def pick(logits: jax.Array, seen: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
    """The next token of each row, int32 [B], from ``logits`` [B, V] and ``rows``: ``temperature`` [B] f32,
    ``top_k`` [B] i32 (0: all), ``top_p`` [B] f32, ``penalty`` [B] f32, ``seed`` [B] u32, ``step`` [B] i32."""
    logits = penalize(logits.astype(jnp.float32), seen, rows["penalty"])
    greedy = first_max(logits)
    temperature = rows["temperature"]
    # The sort, the softmaxes and the random draws only run where a row samples (a branch, not a mask).
    return jax.lax.cond(jnp.any(temperature > 0), lambda: _sample(logits, greedy, rows), lambda: greedy)


def _sample(logits: jax.Array, greedy: jax.Array, rows: dict[str, jax.Array]) -> jax.Array:
    """:func:`pick` where some row samples: each sampling row's token, the greedy rows' from ``greedy``."""
    temperature = rows["temperature"]
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    vocab = logits.shape[-1]
    ordered = jnp.sort(scaled, axis=-1)[:, ::-1]
    k = jnp.where(rows["top_k"] > 0, jnp.minimum(rows["top_k"], vocab), vocab)
    kth = jnp.take_along_axis(ordered, (k - 1)[:, None], axis=-1)  # [B, 1]: the k-th largest
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the probability of the more likely tokens
    kept = jnp.where(before < rows["top_p"][:, None], ordered, jnp.inf)  # the most likely is always kept
    threshold = jnp.maximum(jnp.min(kept, axis=-1, keepdims=True), kth)
    scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
    keys = jax.vmap(lambda s, n: jax.random.fold_in(jax.random.PRNGKey(s), n))(rows["seed"], rows["step"])
    sampled = jax.vmap(lambda key, row: jax.random.categorical(key, row))(keys, scaled).astype(jnp.int32)
    return jnp.where(temperature > 0, sampled, greedy)
