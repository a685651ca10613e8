"""A request's parameters, checked when the request is made: :class:`SamplingParams`."""

from __future__ import annotations

import dataclasses

from onnx2jax.errors import RequestError


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one request generates.

    Attributes:
      max_tokens: the most tokens to generate (> 0); generation also ends at the model's context.
      temperature: 0 takes the most likely token (greedy; ties to the lowest id), > 0 samples.
      top_k: sample among the k most likely tokens (0: all).
      top_p: sample among the most likely tokens whose probabilities reach top_p, in (0, 1].
      seed: of the sampling: the same seed gives the same tokens, whatever runs beside the request.
      repetition_penalty: transformers' (1: none): logits of tokens already in the sequence divided by it where
        positive, multiplied where negative.
      stop_token_ids: tokens that end generation (not returned), besides the model's eos.
      ignore_eos: do not stop at the model's eos.

    Raises:
      RequestError: a value out of its range, named.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    repetition_penalty: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise RequestError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0:
            raise RequestError("temperature", f"must be >= 0 (0: greedy), got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError("top_k", f"must be an integer >= 0 (0: no limit), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise RequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if not self.repetition_penalty > 0:
            raise RequestError("repetition_penalty", f"must be > 0, got {self.repetition_penalty!r}")
        if not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise RequestError("seed", f"must be an integer in [0, 2**32), got {self.seed!r}")

    def row(self, step: int) -> dict:
        """The per-slot sampling data of :func:`onnx2jax.serving.sampler.pick` at the request's ``step``-th
        generated token."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "penalty": self.repetition_penalty, "seed": self.seed, "step": step}
