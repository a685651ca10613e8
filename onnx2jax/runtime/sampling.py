"""Choosing the next token from logits: greedy, or sampled with temperature, top-k and top-p (jax.random), after
transformers' repetition penalty where one is asked.

Only greedy-or-sampled and penalized-or-not are part of a compiled step; temperature, top-k, top-p and the
penalty are data (:meth:`Search.values`), so changing them compiles nothing.
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
      repetition_penalty: transformers' (:func:`penalize`) over the prompt and the tokens so far (1.0: none).
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 to sample, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no limit), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0 (1: none), got {self.repetition_penalty}")

    @property
    def penalized(self) -> bool:
        """Whether a repetition penalty applies (compiled into the step: the tokens seen are then its state)."""
        return self.repetition_penalty != 1

    def values(self) -> dict[str, np.ndarray]:
        """temperature, top_k, top_p and the penalty as the arrays a compiled step takes."""
        return {"temperature": np.float32(self.temperature), "top_k": np.int32(self.top_k),
                "top_p": np.float32(self.top_p), "penalty": np.float32(self.repetition_penalty)}


def penalize(logits: jax.Array, seen: jax.Array, penalty: jax.Array) -> jax.Array:
    """The repetition penalty as transformers and onnxruntime-genai apply it: a seen token's logit divided by
    ``penalty`` where positive, multiplied where negative (``penalty`` 1: unchanged). ``logits`` and ``seen``
    (bool) [B, V], ``penalty`` [B] or []."""
    p = jnp.reshape(penalty, (-1, 1)) if jnp.ndim(penalty) else penalty
    return jnp.where(seen, jnp.where(logits < 0, logits * p, logits / p), logits)


def seen_tokens(ids: jax.Array, valid: jax.Array, vocab: int) -> jax.Array:
    """[B, vocab] bool: which ids each row of ``ids`` [B, n] holds where ``valid`` [B, n]."""
    rows = jnp.arange(ids.shape[0])[:, None]
    return jnp.zeros((ids.shape[0], vocab), bool).at[rows, ids].max(valid, mode="drop")


def first_max(logits: jax.Array) -> jax.Array:
    """``jnp.argmax(logits, axis=-1)`` as int32 (the lowest id among equal maxima; the first NaN where there is
    one), computed as a max and then the lowest position holding it: two plain reductions, which XLA CPU
    vectorizes, where argmax's (value, index) reduction is not (16 rows of 512 logits: ~45 us of CPU against
    ~15 us, a tenth of the tiny model's decode step)."""
    top = jnp.max(logits, axis=-1, keepdims=True)
    at = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    hit = (logits == top) | jnp.isnan(logits)
    return jnp.min(jnp.where(hit, at, logits.shape[-1]), axis=-1)


def choose(logits: jax.Array, key: jax.Array, do_sample: bool, values: dict[str, jax.Array]) -> jax.Array:
    """The next token of each row of ``logits`` [batch, vocab], as int32 [batch]; ``values`` as
    :meth:`Search.values` gives them."""
    logits = logits.astype(jnp.float32)
    if not do_sample:
        return first_max(logits)
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
