"""The serving engine: requests in, steps run, tokens out per request (continuous batching).

:class:`Engine` keeps the requests, asks the :mod:`~onnx2jax.serving.scheduler` for each step's work, runs it on
the :mod:`~onnx2jax.serving.runner` (one prefill call, a chunk of each of up to ``prefill_rows`` newcomers, and
one decode step of every decoding slot) and hands each
request its new tokens: :meth:`Engine.step` returns them, :meth:`Engine.stream` iterates one request's tokens
as they are made (stepping the engine itself when nobody else does). A token comes to the host every step
(with ``decode_steps`` > 1, every call of up to that many decode steps, where no request waits to be admitted).

Where GroupQueryAttention writes its own cache in place, the engine lowers the op onto the pages (not what
onnxruntime-genai's paged engine does): each GroupQueryAttention writes its new keys and values into the
request's pages through its block table and attends over them read through it, with no contiguous copy of the
cache (:mod:`~onnx2jax.serving.runner`; graphs that concatenate past and new get a gathered view instead).

A request ends at the model's eos or one of its ``stop_token_ids`` (neither returned), at ``max_tokens``, at the
model's context, or on :meth:`Engine.abort`; :meth:`Engine.finish_reason` says which (``"stop"``,
``"length"``, ``"abort"``).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Any, Iterator, Sequence as Seq

from onnx2jax.errors import RequestError
from onnx2jax.serving.params import SamplingParams
from onnx2jax.serving.runner import ModelRunner
from onnx2jax.serving.sampler import STEP_COLUMN, sampling_columns
from onnx2jax.serving.scheduler import Scheduler, Sequence, State
from onnx2jax.serving.source import ModelSource, open_model


@dataclasses.dataclass
class _Request:
    seq: Sequence
    params: SamplingParams
    prompt_length: int
    generated: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    unread: int = 0  # tokens of `generated` not yet given by stream()
    arrived: float = 0.0
    first_token: float | None = None
    columns: Any = None  # its sampling parameters packed (sampler.sampling_columns)

    def sampling(self) -> Any:
        """Its sampling columns at its next token (only the generated count changes)."""
        self.columns[STEP_COLUMN] = len(self.generated)
        return self.columns


class Engine:
    """Continuous batching over a paged KV cache (module docstring; the cache and attention:
    :mod:`onnx2jax.serving.runner`).

    Args:
      model: a genai folder, an .onnx path, a handle of :func:`onnx2jax.load`, or a :class:`ModelSource`.
      max_batch: slots: the most requests decoding at once; more wait in the queue.
      max_tokens_in_cache: positions the cache holds over all requests (rounded up to whole pages).
      page_size: positions per page.
      prefill_chunk: the most prompt tokens of one request prefilled in one step (a multiple of page_size).
      prefill_rows: requests prefilled together in one step (a chunk each).
      context_length: the longest sequence; default the model's (genai_config.json); required without one.
      eos_token_ids: default the model's.
      devices: tensor-parallel over this many devices (the pages split by KV heads); a handle brings its own.
      decode_steps: decode steps run in one call when no request waits to be admitted (1: one a call). More
        saves the per-call cost of all but one step (several times the tokens/s of a small model), but a
        request's tokens then come in bursts of up to this many, and a newcomer waits up to this many steps to
        start: for batch work, not for streaming to someone who watches.
      target: plan for a TPU topology that is not attached (``"tpu:v5e:2x4"``): the engine's programs then
        lower over an abstract cache (``engine.runner.lower("decode", rows, width)``) and nothing runs.

    Attributes:
      runner, scheduler: the two layers below.
      source: the model.
    """

    def __init__(self, model: Any, *, max_batch: int = 8, max_tokens_in_cache: int = 4096, page_size: int = 16,
                 prefill_chunk: int = 32, prefill_rows: int = 4, context_length: int | None = None,
                 eos_token_ids: Seq[int] | None = None, devices: int | None = None, decode_steps: int = 1,
                 target: str | None = None):
        self.source = model if isinstance(model, ModelSource) else open_model(model, devices=devices, target=target)
        context = context_length or self.source.context_length
        if context is None:
            raise ValueError(f"{self.source.layout.source}: the model's context length is unknown: give context_length")
        if prefill_chunk % page_size:
            raise ValueError(f"prefill_chunk ({prefill_chunk}) must be a multiple of page_size ({page_size})")
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        if decode_steps < 1:
            raise ValueError(f"decode_steps must be >= 1, got {decode_steps}")
        self.context_length = int(context)
        # A chunk starts at a multiple of prefill_chunk below the context, so the window holds its padding.
        window = -(-self.context_length // prefill_chunk) * prefill_chunk
        num_pages = -(-max_tokens_in_cache // page_size)
        rows = min(prefill_rows, max_batch)
        self.scheduler = Scheduler(slots=max_batch, num_pages=num_pages, page_size=page_size, chunk=prefill_chunk,
                                   prefill_rows=rows)
        self.runner = ModelRunner(self.source, slots=max_batch, num_pages=num_pages, page_size=page_size,
                                  pages_per_slot=window // page_size, chunk=prefill_chunk, prefill_rows=rows,
                                  decode_steps=decode_steps)
        self.decode_steps = decode_steps
        self.eos = tuple(self.source.layout.eos_token_ids if eos_token_ids is None else eos_token_ids)
        self.max_batch = max_batch
        self._requests: dict[int, _Request] = {}
        self._ids = itertools.count()
        self.stats = {"steps": 0, "prefill_chunks": 0, "decode_tokens": 0, "preemptions": 0}

    # ---- requests

    def check_request(self, prompt_ids: Seq[int], params: SamplingParams) -> list[int]:
        """The prompt as a list of ints, checked against the vocabulary, the context and the cache.

        Raises:
          RequestError: an empty prompt, an id outside [0, vocabulary), a prompt that leaves no room in the
            context, or a request longer than the whole cache.
        """
        prompt = [int(t) for t in prompt_ids]
        vocab = self.source.vocab_size
        if not prompt:
            raise RequestError("prompt", "is empty: give at least one token")
        bad = next(((i, t) for i, t in enumerate(prompt) if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError("prompt", f"token {bad[1]} at position {bad[0]} is outside the vocabulary [0, {vocab})")
        if len(prompt) >= self.context_length:
            raise RequestError(
                "prompt", f"has {len(prompt)} tokens; the model's context is {self.context_length}, which leaves no "
                "room for a new token"
            )
        longest = min(len(prompt) + params.max_tokens, self.context_length)
        capacity = self.scheduler.num_pages * self.scheduler.page_size
        if longest > capacity:
            raise RequestError(
                "max_tokens", f"prompt ({len(prompt)}) + max_tokens ({params.max_tokens}) needs {longest} cache "
                f"positions; the whole cache holds {capacity} (max_tokens_in_cache)"
            )
        return prompt

    def add_request(self, prompt_ids: Seq[int], params: SamplingParams | None = None) -> int:
        """Queues a request; returns its id. It starts at a coming :meth:`step`.

        Raises:
          RequestError: see :meth:`check_request`.
        """
        params = params or SamplingParams()
        prompt = self.check_request(prompt_ids, params)
        rid = next(self._ids)
        request = _Request(Sequence(rid, list(prompt)), params, len(prompt), arrived=time.perf_counter(),
                           columns=sampling_columns([params.row(0)])[0])
        self._requests[rid] = request
        self.scheduler.add(request.seq)
        return rid

    def abort(self, rid: int) -> None:
        """Ends a request now, freeing its slot and pages (nothing for one already finished)."""
        request = self._requests.get(rid)
        if request is not None and request.finish_reason is None:
            self._finish(request, "abort")

    def release(self, rid: int) -> None:
        """Forgets a finished request (aborting it first if it is not)."""
        self.abort(rid)
        self._requests.pop(rid, None)

    def finish_reason(self, rid: int) -> str | None:
        """``"stop"``, ``"length"``, ``"abort"``, or None while it runs."""
        return self._requests[rid].finish_reason

    def tokens(self, rid: int) -> list[int]:
        """The tokens a request has generated so far."""
        return list(self._requests[rid].generated)

    def generated(self, rid: int) -> int:
        """How many tokens a request has generated so far."""
        return len(self._requests[rid].generated)

    def time_to_first_token(self, rid: int) -> float | None:
        """Seconds from the request's arrival to its first token (None before it)."""
        request = self._requests[rid]
        return None if request.first_token is None else request.first_token - request.arrived

    def has_work(self) -> bool:
        """Whether a request is waiting or running."""
        return bool(self.scheduler.waiting or self.scheduler.running)

    @property
    def counts(self) -> dict[str, int]:
        """Requests waiting and running, slots and pages in use."""
        s = self.scheduler
        return {"waiting": len(s.waiting), "running": len(s.running), "slots_used": self.max_batch - len(s.free_slots),
                "pages_used": s.num_pages - len(s.free_pages), "pages": s.num_pages}

    # ---- stepping

    def step(self) -> dict[int, list[int]]:
        """Runs one step (``decode_steps`` decode steps where no request waits to be admitted); returns the new
        tokens of each request that got any (a request's last step may give none: its eos or stop token is not
        returned; :meth:`finish_reason` tells it has ended)."""
        steps = self._plan_ahead()
        plan = self.scheduler.schedule()
        self.stats["steps"] += 1
        self.stats["preemptions"] += len(plan.preempted)
        out: dict[int, list[int]] = {}
        if plan.prefill:
            chunks = []
            for seq, start, count in plan.prefill:
                request = self._requests[seq.id]
                chunks.append((seq.slot, seq.block, start, seq.tokens[start:start + count], request.sampling()))
            tokens = self.runner.prefill(chunks)
            self.stats["prefill_chunks"] += len(chunks)
            for (seq, start, count), token in zip(plan.prefill, tokens):
                seq.cached = start + count
                if seq.cached == len(seq.tokens):
                    seq.state = State.DECODE
                    self._take(self._requests[seq.id], token, out)
        if plan.decode:
            width = self.runner.rows_for(max(s.slot for s in plan.decode))
            slots: list[Any] = [None] * width
            lengths, tokens, rows, left = [0] * width, [0] * width, [None] * width, [0] * width
            for seq in plan.decode:
                request = self._requests[seq.id]
                slots[seq.slot], lengths[seq.slot], tokens[seq.slot] = seq.block, seq.cached, seq.tokens[-1]
                rows[seq.slot] = request.sampling()
                left[seq.slot] = seq.ahead if steps > 1 else 1
            chosen = self.runner.decode(slots, lengths, tokens, rows, steps=steps, steps_left=left)
            for seq in plan.decode:
                request = self._requests[seq.id]
                for k in range(left[seq.slot]):
                    if request.finish_reason is not None:  # ended at an earlier of these steps
                        break
                    seq.cached += 1
                    self.stats["decode_tokens"] += 1
                    self._take(request, int(chosen[k, seq.slot]), out)
        return out

    def _plan_ahead(self) -> int:
        """The decode steps of the coming step: ``decode_steps`` where no request waits to be admitted and the
        free pages hold every decoding request's next ones (each running at most to its ``max_tokens`` or the
        context: its ``ahead``), else 1."""
        running = self.scheduler.running
        for seq in running:
            seq.ahead = 1
        if self.decode_steps == 1 or self.scheduler.waiting:
            return 1
        pages = 0
        for seq in (s for s in running if s.state is State.DECODE):
            request = self._requests[seq.id]
            room = min(request.params.max_tokens - len(request.generated), self.context_length - len(seq.tokens))
            seq.ahead = max(1, min(self.decode_steps, room))
            pages += max(0, self.scheduler.pages_for(seq.cached + seq.ahead) - len(seq.block))
        if pages > len(self.scheduler.free_pages):
            for seq in running:
                seq.ahead = 1
            return 1
        return self.decode_steps

    def _take(self, request: _Request, token: int, out: dict[int, list[int]]) -> None:
        """A request's new token: kept and returned, or the end (eos / stop token not returned)."""
        params = request.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos):
            self._finish(request, "stop")
            return
        request.generated.append(token)
        request.seq.tokens.append(token)
        if request.first_token is None:
            request.first_token = time.perf_counter()
        out.setdefault(request.seq.id, []).append(token)
        if len(request.generated) >= params.max_tokens or len(request.seq.tokens) >= self.context_length:
            self._finish(request, "length")

    def _finish(self, request: _Request, reason: str) -> None:
        request.finish_reason = reason
        self.scheduler.remove(request.seq)

    def stream(self, rid: int) -> Iterator[int]:
        """The request's tokens as they are made; steps the engine while none is ready (every request
        advances with it)."""
        request = self._requests[rid]
        while True:
            while request.unread < len(request.generated):
                request.unread += 1
                yield request.generated[request.unread - 1]
            if request.finish_reason is not None:
                return
            self.step()

    def warmup(self) -> None:
        """Compiles every program shape serving can meet (:meth:`ModelRunner.warm`), so that no request waits for
        a compile; a request then compiles nothing."""
        self.runner.warm()

    def run_to_completion(self) -> None:
        """Steps until no request waits or runs."""
        while self.has_work():
            self.step()
