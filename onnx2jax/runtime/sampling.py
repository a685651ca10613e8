"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p (jax.random).

Only greedy-or-sampled is part of a compiled step; temperature, top-k and top-p are data
(:meth:`Search.values`), so changing them compiles nothing.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Search:
    """How the next token is chosen.

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

    def values(self) -> dict[str, np.ndarray]:
        """temperature, top_k and top_p as the arrays a compiled step takes."""
        return {"temperature": np.float32(self.temperature), "top_k": np.int32(self.top_k),
                "top_p": np.float32(self.top_p)}


def choose(logits: jax.Array, key: jax.Array, do_sample: bool, values: dict[str, jax.Array]) -> jax.Array:
    """The next token of each row of ``logits`` [batch, vocab], as int32 [batch]; ``values`` as
    :meth:`Search.values` gives them."""
    logits = logits.astype(jnp.float32)
    if not do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / values["temperature"]
    ordered = jnp.sort(logits, axis=-1)[..., ::-1]
    vocab = logits.shape[-1]
    k = jnp.where(values["top_k"] > 0, jnp.minimum(values["top_k"], vocab), vocab)
    kth = jax.lax.dynamic_index_in_dim(ordered, k - 1, axis=-1)  # [batch, 1]: the k-th largest
    ordered = jnp.where(ordered < kth, -jnp.inf, ordered)
    probs = jax.nn.softmax(ordered, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # the probability of the more likely tokens
    kept = jnp.where(before < values["top_p"], ordered, jnp.inf)  # the most likely token is always kept
    threshold = jnp.maximum(jnp.min(kept, axis=-1, keepdims=True), kth)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
