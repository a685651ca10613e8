"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p (jax.random)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Search:
    """How the next token is chosen; hashable, so a compiled step is keyed by it.

    Attributes:
      do_sample: sample (True) or take the most likely token (False; ties go to the lowest id).
      temperature: logits are divided by it before sampling.
      top_k: sample among the k most likely tokens only (0: all).
      top_p: sample among the most likely tokens whose probabilities sum to at least top_p (1.0: all).
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 to sample, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def choose(logits: jax.Array, key: jax.Array, search: Search) -> jax.Array:
    """The next token of each row of ``logits`` [batch, vocab], as int32 [batch]."""
    logits = logits.astype(jnp.float32)
    if not search.do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / search.temperature
    neg = jnp.asarray(-jnp.inf, logits.dtype)
    if search.top_k and search.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, search.top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, neg, logits)
    if search.top_p < 1:
        ordered = jnp.sort(logits, axis=-1)[..., ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # probability mass of the more likely tokens
        kept = jnp.where(before < search.top_p, ordered, jnp.inf)  # the first token is always kept
        logits = jnp.where(logits < jnp.min(kept, axis=-1, keepdims=True), neg, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
