"""Token generation with a KV cache on device: :func:`generate` and the step-by-step :class:`Generator`.

Which path each format takes (:mod:`onnx2jax.runtime.kv_cache`):

- onnxruntime-genai builder folders (GroupQueryAttention): a cache of ``max_length`` positions written in
  place by the op; prompts of different lengths RIGHT-padded with ``pad_token_id``, as onnxruntime-genai
  feeds them, so a returned row is ``prompt + pads + continuation``.
- torch / transformers exports (``past_key_values.N.*`` in, ``present.N.*`` out, the graph concatenates):
  a buffer of ``max_length - 1`` positions passed whole as the past with the mask at 0 where nothing is
  written yet; the present's new position is copied in. One decode program still. LEFT-padded as
  transformers does: a row is ``pads + prompt + continuation``.
- no cache inputs: the whole sequence recomputed each step (quadratic, a compile per length).

As onnxruntime-genai returns them: the prompt is included, ``max_length`` counts the padded prompt, a single
prompt stops before its eos (the eos is not returned), and in a batch a row that reached eos keeps it and is
filled with ``pad_token_id`` while the other rows go on.
"""

from __future__ import annotations

import collections
import functools
import os
import warnings
from typing import Any, Iterator, Sequence

import jax
import numpy as np

from onnx2jax.runtime.decoder import DECODE_STEPS, Decoder
from onnx2jax.runtime.load import load
from onnx2jax.runtime.generate_inputs import check_prompts
from onnx2jax.runtime.sampling import Search
from onnx2jax.runtime.search_options import SearchDefaults, search_defaults
from onnx2jax.translate import JaxModel

QUADRATIC_NOTE = (
    "this model has no KV cache inputs: each step recomputes the whole sequence (quadratic in its length, one "
    "compile per length); export it with a cache (onnxruntime-genai's model builder, or torch.onnx.export "
    "with past_key_values) to decode one token a step"
)


_RECENT: list[Decoder] = []
"""The handle :class:`Generator` (and so :func:`generate`) last loaded from a path: held, so that generating from
the same path again compiles nothing; replaced by the next path's. A handle from :func:`onnx2jax.load` passed in
instead lives exactly as long as its caller holds it."""


def _handle(model: str | os.PathLike | JaxModel | Decoder, devices: int | None, mesh: Any) -> Decoder:
    """The handle for ``model`` (:func:`onnx2jax.load`, which reuses a held one), the last path's kept."""
    decoder = load(model, devices=devices, mesh=mesh)
    if isinstance(model, (str, os.PathLike)):
        _RECENT[:] = [decoder]
    return decoder


class Generator:
    """Generation one token at a time: ``generate_next_token()`` until ``is_done()``, or iterate for each
    step's new tokens; ``sequences`` holds the tokens so far, prompt included.

    Args:
      model: a handle from :func:`onnx2jax.load` (a :class:`Decoder`: its compiled steps are reused), or what
        ``load`` takes (a genai folder, an .onnx file, a JaxModel): a path loaded before with the same devices
        and mesh, and still held, is not loaded again (the last path loaded here is held: `_RECENT`).
      input_ids: one prompt (a sequence of ints) or several (a sequence of sequences, lengths may differ; or a
        2-D array whose rows may be padded with pad_token_id on either side).
      max_length: the longest sequence returned, prompt (padded) included; default genai_config's
        ``search.max_length``, else the context length.
      max_new_tokens: instead of max_length: the padded prompt's width plus this.
      devices, mesh: run tensor-parallel (:mod:`onnx2jax.runtime.generate_sharding`); fixed by ``load``, so
        only with a path or model, not with a handle.
      do_sample, temperature, top_k, top_p, repetition_penalty: greedy or sampled (top-k and top-p only where
        sampling), the penalty transformers' (1: none); None takes genai_config.json's search defaults
        (:mod:`onnx2jax.runtime.search_options`), else greedy without penalty.
      seed: of the sampling (``jax.random``): the same seed gives the same tokens; None: genai_config's
        random_seed where >= 0, else 0.
      eos_token_id: one id or several; default genai_config's.
      pad_token_id: fills padding and rows done; default genai_config's, else the first eos, else 0.

    Raises:
      ValueError: a prompt longer than the context or than max_length, max_length beyond the context,
        no max_length to be found, or prompts of different lengths for a model without attention_mask.
      SearchOptionError: genai_config.json asks for a search option not implemented (``num_beams`` > 1, ...).
    """

    def __init__(
        self,
        model: str | os.PathLike | JaxModel | Decoder,
        input_ids: Any,
        *,
        max_length: int | None = None,
        max_new_tokens: int | None = None,
        devices: int | None = None,
        mesh: Any = None,
        do_sample: bool | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        eos_token_id: int | Sequence[int] | None = None,
        pad_token_id: int | None = None,
    ):
        self.decoder = _handle(model, devices, mesh)
        layout = self.decoder.layout
        defaults = search_defaults(layout.search, layout.source) or SearchDefaults()
        do_sample = defaults.do_sample if do_sample is None else bool(do_sample)
        self.search = Search(
            do_sample=do_sample,
            temperature=float(_given(temperature, defaults.temperature)),
            top_k=int(_given(top_k, defaults.top_k if do_sample else 0)),
            top_p=float(_given(top_p, defaults.top_p)),
            repetition_penalty=float(_given(repetition_penalty, defaults.repetition_penalty)),
        )
        seed = _given(seed, defaults.seed if defaults.seed is not None else 0)
        if eos_token_id is None:
            self.eos = tuple(layout.eos_token_ids)
        else:
            self.eos = (int(eos_token_id),) if np.ndim(eos_token_id) == 0 else tuple(int(e) for e in eos_token_id)
        self._eos_ids = np.array(self.eos, np.int32)
        if pad_token_id is None:
            pad_token_id = layout.pad_token_id if layout.pad_token_id is not None else (self.eos or (0,))[0]
        self.pad = int(pad_token_id)
        self.prompts = _prompts(input_ids, self.pad)
        check_prompts(input_ids, self.prompts, self.decoder.vocab, layout.input_ids)
        self.batch = len(self.prompts)
        self.width = max(len(p) for p in self.prompts)
        self.max_length = self._max_length(max_length, max_new_tokens)
        if layout.kind == "none":
            if layout.attention_mask is None and len({len(p) for p in self.prompts}) > 1:
                raise ValueError(
                    "prompts of different lengths need padding, and this model has no attention_mask input: "
                    "give prompts of one length"
                )
            warnings.warn(QUADRATIC_NOTE, stacklevel=2)
        self._key = _prng_key(int(seed))
        self._new: list[np.ndarray] = []
        self._done = np.zeros(self.batch, bool)
        self._finished = self.width >= self.max_length
        if layout.kind != "none" and not self._finished:  # tensor-parallel: planned at this prefill's shapes
            capacity = self.decoder.buffer_capacity(self.max_length)
            self.decoder.plan_prefill(self.batch, self.decoder.prefill_width(self.width, capacity), capacity)
        self._cache = self._state = self._token = None
        self._ready: collections.deque[np.ndarray] = collections.deque()  # steps' tokens checked, not yet returned
        self._taken = 0  # tokens generated and checked: those returned and those ready
        self._ends = False  # generation is done once the ready tokens are returned

    def _max_length(self, max_length: int | None, max_new_tokens: int | None) -> int:
        layout = self.decoder.layout
        context = layout.context_length
        where = f"(context_length in {layout.source})"
        if self.width > (context or self.width):
            raise ValueError(
                f"the prompt has {self.width} tokens, longer than the model's context of {context} {where}"
            )
        if max_new_tokens is not None:
            if max_length is not None:
                raise ValueError("give max_length or max_new_tokens, not both")
            max_length = self.width + int(max_new_tokens)
        elif max_length is None:
            max_length = layout.search.get("max_length", context)
            if max_length is None:
                raise ValueError(
                    "give max_length or max_new_tokens: the model has no genai_config.json to take a default from"
                )
        if context is not None and max_length > context:
            raise ValueError(f"max_length {max_length} is beyond the model's context of {context} {where}")
        if self.width > max_length:
            raise ValueError(f"the prompt has {self.width} tokens, more than max_length {max_length}")
        return int(max_length)

    def is_done(self) -> bool:
        """Whether generation has ended: max_length reached, or every row at eos."""
        return self._finished

    def generate_next_token(self) -> np.ndarray:
        """Runs one step (the prefill first) and returns its new token of each row, int32 [batch].

        A single prompt's eos ends generation without being returned (an empty array then); in a batch, a
        row done gets pad_token_id. Tokens a call of several steps already computed are returned first.
        """
        if self._finished:
            raise RuntimeError("generation is done (is_done() is True)")
        if not self._ready:
            self._take(self._run(1))
            if not self._ready:  # a single prompt's eos: not returned
                self._finish()
                return np.zeros(0, np.int32)
        return self._next()

    def _run(self, steps: int) -> np.ndarray:
        """The next tokens, [k, batch] int32 with 1 <= k <= steps: the prefill's first token, else up to
        ``steps`` decode steps in one call of the decode program (bounded by max_length and
        `~onnx2jax.runtime.decoder.DECODE_STEPS`; fewer where every row reached eos), one transfer."""
        decoder = self.decoder
        if decoder.layout.kind == "none":
            return self._recompute_step()[None]
        if self._cache is None:
            capacity = decoder.buffer_capacity(self.max_length)
            ids, lengths = _pad(self.prompts, decoder.prefill_width(self.width, capacity), self.pad,
                                decoder.layout.padding)
            cache = decoder.empty_cache(self.batch, capacity)
            program = decoder.prefill(self.search)
            self._cache, self._state, self._token = program(decoder.params, cache, ids, lengths, self._sampling())
            return np.asarray(self._token)[None]
        count = min(steps, DECODE_STEPS, self.max_length - self.width - self._taken)
        program = decoder.decode(self.search)
        self._cache, self._state, self._token, tokens = program(
            decoder.params, self._cache, self._state, self._token, np.int32(count)
        )
        return np.asarray(tokens)[:, :count].T

    def _take(self, chunk: np.ndarray) -> None:
        """Queues the steps' tokens ``chunk`` [k, batch] up to where generation ends (eos and max_length as
        the module docstring says), checked for the whole chunk at once: a per-token check would cost about
        a decode step of the tiny fixtures."""
        hits = (chunk[..., None] == self._eos_ids).any(-1) & ~self._done  # np.isin costs ~4x more a call
        ends = False
        if self.batch == 1:
            at = np.flatnonzero(hits[:, 0])
            if at.size:  # the eos is not returned
                chunk, ends = chunk[: at[0]], True
        else:
            done = self._done | np.logical_or.accumulate(hits, axis=0)
            at = np.flatnonzero(done.all(axis=1))
            if at.size:  # every row done: the step that finished the last one is returned
                chunk, done, ends = chunk[: at[0] + 1], done[: at[0] + 1], True
            self._done = done[-1]
        self._taken += len(chunk)
        self._ends = ends or self.width + self._taken >= self.max_length
        self._ready.extend(chunk)

    def _next(self) -> np.ndarray:
        """The next queued step's tokens, into the sequences; generation is done after the last of an end."""
        token = self._ready.popleft()
        self._new.append(token)
        if self._ends and not self._ready:
            self._finish()
        return token

    def _recompute_step(self) -> np.ndarray:
        ids, lengths = _pad(self.prompts, self.width, self.pad, "left")
        if self._new:
            ids = np.concatenate([ids, np.stack(self._new, axis=1)], axis=1)
        mask = np.arange(ids.shape[1])[None] >= (self.width - lengths)[:, None]
        program = self.decoder.recompute(self.search)
        state = {**self._sampling(), "done": self._done, "step": np.int32(len(self._new))}
        token, _ = program(self.decoder.params, ids, mask, state)
        return np.asarray(token)

    def _sampling(self) -> dict[str, Any]:
        """What the programs take as data for choosing tokens: the key, the eos ids and the pad id."""
        return {"key": self._key, "eos": np.array(self.eos or (-1,), np.int32), "pad": np.int32(self.pad),
                **self.search.values()}

    def _finish(self) -> None:
        self._finished = True
        self._cache = self._state = self._token = None  # the device buffers go now

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each step's new tokens, [batch] int32, until done (a single prompt's eos is not yielded), each as it
        is made: one decode step per call of the decode program, its tokens on the host and yielded before the
        next step runs (someone is listening). :func:`generate`, which only wants the end, runs
        `~onnx2jax.runtime.decoder.DECODE_STEPS` steps per call instead."""
        return self._steps(1)

    def _steps(self, per_call: int) -> Iterator[np.ndarray]:
        """Each step's new tokens, the decode program running up to ``per_call`` steps per call."""
        while not self._finished:
            if not self._ready:
                self._take(self._run(per_call))
                if not self._ready:  # a single prompt's eos: not yielded
                    self._finish()
                    return
            yield self._next()

    def compile_decode(self) -> None:
        """Readies the decode program now, after the prefill: compiles it (or loads it from the persistent
        cache) and runs its step once, so that timing the decode that follows times neither the compile nor the
        first execution of the step (some milliseconds of one-time set-up on CPU, which would weigh on a short
        run): the CLI's tokens/s is decode tokens over decode time alone, the same whatever the number of
        tokens. The step runs on a copy of the state and its token is dropped; its only trace is the next
        position of the cache, written with what the real step writes there again (the same token, position and
        past), so the tokens are unchanged. Does nothing before the prefill, once done, or without a cache."""
        if self._finished or self._cache is None or self.decoder.layout.kind == "none":
            return
        program = self.decoder.decode(self.search)
        state = jax.tree_util.tree_map(lambda a: a.copy(), self._state)  # donated to the call; ours kept
        self._cache, _, token, _ = program(self.decoder.params, self._cache, state, self._token, np.int32(1))
        jax.block_until_ready(token)

    @property
    def sequences(self) -> np.ndarray:
        """The tokens so far, [batch, length] int64, prompt included, padded as the module docstring says."""
        side = "left" if self.decoder.layout.padding == "left" else "right"
        ids, _ = _pad(self.prompts, self.width, self.pad, side)
        new = np.stack(self._new, axis=1) if self._new else np.zeros((self.batch, 0), np.int32)
        return np.concatenate([ids, new], axis=1).astype(np.int64)


def generate(
    model: str | os.PathLike | JaxModel | Decoder,
    input_ids: Any,
    *,
    max_length: int | None = None,
    max_new_tokens: int | None = None,
    devices: int | None = None,
    mesh: Any = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
) -> np.ndarray:
    """Generates tokens from a decoder LLM; returns the ids ``[batch, <= max_length]``, prompt included.

    A 1-D ``input_ids`` (one prompt) returns a 2-D array of one row, like a batch. See :class:`Generator` for
    the arguments and the module docstring for padding and eos.

    Example:
      >>> onnx2jax.generate("tests/data/genai/llama_gqa", [[1, 17, 230]], max_new_tokens=4)  # doctest: +SKIP
    """
    generator = Generator(
        model, input_ids, max_length=max_length, max_new_tokens=max_new_tokens, devices=devices, mesh=mesh,
        do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
        repetition_penalty=repetition_penalty, seed=seed, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
    for _ in generator._steps(DECODE_STEPS):  # nobody listens: as many steps per call as the program runs
        pass
    return generator.sequences


@functools.lru_cache(maxsize=32)
def _prng_key(seed: int) -> jax.Array:
    """``jax.random.PRNGKey(seed)``, kept per seed (the programs take it as data without donating it).

    With JAX's default threefry keys, 32-bit types and a seed that fits them, the key is ``[0, seed]`` as two
    uint32 (threefry's seed: the seed's high 32 bits, zero when shifted out of a 32-bit integer, then its low
    32 bits), made here: ``jax.random.PRNGKey`` compiles a small program for it, ~40 ms of a process's first
    token. Any other case asks JAX."""
    if (jax.config.jax_default_prng_impl == "threefry2x32" and not jax.config.jax_enable_x64
            and -(2**31) <= seed < 2**31):
        return jax.device_put(np.array([0, seed & 0xFFFFFFFF], np.uint32))
    return jax.random.PRNGKey(seed)


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _prompts(input_ids: Any, pad: int) -> list[list[int]]:
    """Prompts as lists of ints: one prompt, ragged prompts, or a 2-D array's rows stripped of pads at the ends."""
    if isinstance(input_ids, np.ndarray) or hasattr(input_ids, "shape"):
        array = np.asarray(input_ids)
        if array.ndim == 1:
            prompts = [array.tolist()]
        elif array.ndim == 2:
            prompts = [_strip(row.tolist(), pad) for row in array]
        else:
            raise ValueError(f"input_ids must be 1-D or 2-D, got shape {array.shape}")
    elif len(input_ids) and np.ndim(input_ids[0]) == 0:
        prompts = [[int(t) for t in input_ids]]
    else:
        prompts = [[int(t) for t in p] for p in input_ids]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    return prompts


def _strip(row: list[int], pad: int) -> list[int]:
    start, end = 0, len(row)
    while start < end and row[start] == pad:
        start += 1
    while end > start and row[end - 1] == pad:
        end -= 1
    return row[start:end]


def _pad(prompts: list[list[int]], width: int, pad: int, side: str) -> tuple[np.ndarray, np.ndarray]:
    """The prompts as one int32 [batch, width] array padded on ``side``, and their lengths."""
    ids = np.full((len(prompts), width), pad, np.int32)
    for row, prompt in enumerate(prompts):
        if side == "right":
            ids[row, : len(prompt)] = prompt
        else:
            ids[row, width - len(prompt):] = prompt
    return ids, np.array([len(p) for p in prompts], np.int32)
