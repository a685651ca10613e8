"""A decoder LLM ready to generate: its model, cache layout, parameters on device and compiled steps.

:class:`Decoder` loads a model (a genai folder, an .onnx file, a :class:`~onnx2jax.translate.JaxModel`), finds
its cache (:mod:`onnx2jax.runtime.kv_cache`) and compiles two programs per (batch, capacity): the prefill (the
prompt; one program per prompt width, rounded up to `PREFILL_BUCKET` where the layout pads on the right) and
the decode program (up to `DECODE_STEPS` tokens, one step for each, in one call). Both take the cache as a
donated argument and return it updated, so it stays on the device and is written in place; the decode program
takes its position and its number of steps as data, so it compiles once for every step of a run and every run of
the same batch and capacity. Each step also chooses the next token on the device
(:mod:`onnx2jax.runtime.sampling`) and checks eos there: what comes back to the host is one token id per row
and step, once per call.

Why several steps a call: on a small model a call's fixed cost (binding some thirty arguments, starting the
executable, the host transfer of its tokens) is of the order of the step itself. XLA CPU runs the steps of one
call back to back in a ``while`` loop (35 µs a step against 92 µs as one call per step on the tiny fixture,
``bench/RESULTS.md``), and the loop stops on device once every row is at eos.

A model without a cache runs :meth:`Decoder.recompute`: the whole sequence each step, compiled per length.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp

from onnx2jax import genai_config as _genai
from onnx2jax.runtime import generate_inputs, kv_cache
from onnx2jax.runtime.sampling import Search, choose
from onnx2jax.translate import JaxModel, translate

State = dict[str, jax.Array]

PREFILL_BUCKET = 16
"""Prompt widths are rounded up to a multiple of this for a right-padded prefill (one compile per bucket)."""

DECODE_STEPS = 16
"""The most decode steps one call of the decode program runs (its tokens buffer's width). Streaming gets the
tokens of a call at once: at most this many steps late."""


class Decoder:
    """A decoder model with its cache layout and compiled prefill and decode steps.

    Args:
      model: a folder with genai_config.json (onnxruntime-genai's builder) or a model.onnx, an .onnx path,
        or a JaxModel.
      devices, mesh: run tensor-parallel over this many devices, or this mesh
        (:mod:`onnx2jax.runtime.generate_sharding`); None: on the default device.

    Attributes:
      model: the JaxModel.
      placement: the sharded program and the cache's placement (None on one device).
      layout: the cache layout (:class:`~onnx2jax.runtime.kv_cache.CacheLayout`).
      traces: how many times each program was traced (``"prefill"``, ``"decode"``, ``"recompute"``): a
        program traced once per (batch, capacity) compiled once.

    Raises:
      GenaiConfigError: the folder's genai_config.json and its model disagree (naming both).
      ValueError: a cache whose KV heads the devices cannot split (naming both).
    """

    def __init__(self, model: str | os.PathLike | JaxModel, *, devices: int | None = None, mesh: Any = None):
        generate_inputs.check_devices(devices, mesh)
        config_path = None if isinstance(model, JaxModel) else _genai.find_config(model)
        config = _genai.read_genai_config(config_path) if config_path else None
        if isinstance(model, JaxModel):
            self.model = model
        else:
            path = config.model_path if config is not None else _model_file(os.fspath(model))
            self.model = translate(path, scan_layers=False)
            model = path
        graph = self.model.proto.graph
        if config is not None:
            _genai.check_against_model(config, graph)
            self.layout = kv_cache.from_genai_config(config, graph)
        else:
            path = None if isinstance(model, JaxModel) else model
            self.layout = kv_cache.from_graph(graph, self.model.input_names, path)
        self.placement = None
        self._apply = self.model.fn
        if (devices is not None and devices > 1) or mesh is not None:
            from onnx2jax.runtime.generate_sharding import Placement

            source = model if not isinstance(model, JaxModel) else model.proto
            self.placement = Placement(source, self.layout, devices=devices, mesh=mesh)
            self.model = self.placement.compiled.model
            self._apply = self.placement.apply
        self.params = self._place_params()
        self.vocab = generate_inputs.vocabulary(self.model.index_check.uses, self.layout.input_ids,
                                                self.layout.vocab_size)
        self.traces = {"prefill": 0, "decode": 0, "recompute": 0}
        self._programs: dict[tuple, Callable] = {}
        self._inputs = {i.name: i for i in self.model.inputs}

    # ---- placement

    def _place_params(self) -> dict[str, jax.Array]:
        if self.placement is not None:
            return self.placement.params()
        return jax.device_put(dict(self.model.params))

    def empty_cache(self, batch: int, capacity: int) -> tuple[jax.Array, ...]:
        """Zeros for every cache input, ``[batch, kv_heads, capacity, head_size]`` (a ring cache's positions at
        most its window and slack: ``CacheLayout.capacities``), on the device(s)."""
        if self.placement is not None:
            return self.placement.zeros_cache(batch, capacity)
        heads, size = self.layout.kv_heads, self.layout.head_size
        return tuple(jnp.zeros((batch, heads, c, size), self.layout.dtype) for c in self.layout.capacities(capacity))

    def buffer_capacity(self, max_length: int) -> int:
        """Positions of the cache buffer a run up to ``max_length`` tokens needs (module docstring of kv_cache)."""
        return max_length if self.layout.kind == "shared" else max_length - 1

    def prefill_width(self, width: int, capacity: int) -> int:
        """The width the prefill runs a batch of prompts ``width`` wide at: a right-padded layout rounds it up
        to a multiple of `PREFILL_BUCKET` (within the capacity), so prompts of similar lengths share one
        program; a left-padded one keeps it (its buffer positions count the pads)."""
        if self.layout.kind != "shared":
            return width
        return max(width, min(capacity, -(-width // PREFILL_BUCKET) * PREFILL_BUCKET))

    # ---- running

    def x64(self):
        """The 64-bit context the model's int64 inputs need while tracing and calling."""
        return jax.enable_x64(self.model.uses_64bit or jax.config.jax_enable_x64)

    def _forward(self, params, cache: tuple, **named) -> tuple[jax.Array, tuple]:
        """The model on named inputs (cast to the graph's types) and ``cache`` as the past: (logits, presents)."""
        values = {}
        named[self.layout.input_ids] = generate_inputs.model_ids(named[self.layout.input_ids], self.vocab)
        for name, value in named.items():
            dtype = self._inputs[name].dtype
            values[name] = value.astype(dtype) if dtype is not None else value
        values.update(zip(self.layout.past, cache))
        outputs = dict(zip(self.model.output_names, self._apply(params, **values)))
        return outputs[self.layout.logits], tuple(outputs[n] for n in self.layout.present)

    def _named(self, ids, mask, positions) -> dict[str, jax.Array]:
        named = {self.layout.input_ids: ids}
        if self.layout.attention_mask is not None:
            named[self.layout.attention_mask] = mask
        if self.layout.position_ids is not None:
            named[self.layout.position_ids] = positions
        return named

    @staticmethod
    def _pick(logits, state: State, search: Search):
        """The next token of each row (pad for rows already done) and the rows done after it."""
        token = choose(logits, jax.random.fold_in(state["key"], state["step"]), search.do_sample, state)
        token = jnp.where(state["done"], state["pad"], token)
        return token, state["done"] | jnp.isin(token, state["eos"])

    def prefill(self, search: Search) -> Callable:
        """The prefill program: ``(params, cache, ids [B, P] int32, lengths [B] int32, sampling) -> (cache,
        state, first token [B])``; ids padded on the layout's side, lengths the real prompt lengths, sampling
        ``{"key": PRNG key, "eos": int32 [n], "pad": int32 []}`` and :meth:`Search.values` (data: another eos,
        temperature, top-k or top-p compiles nothing; ``search.do_sample`` is the program's)."""
        key_ = ("prefill", search.do_sample)
        if key_ not in self._programs:
            self._programs[key_] = self._jit(self._prefill_fn(search), donate=(1,))
        return self._programs[key_]

    def decode(self, search: Search) -> Callable:
        """The decode program: ``(params, cache, state, token [B], count int32 []) -> (cache, state, last token
        [B], tokens [B, DECODE_STEPS] int32)``: ``count`` steps (at most `DECODE_STEPS`) from ``token``, or fewer
        where every row is done (at eos) before; column i of ``tokens`` is step i's token of each row, pad_token_id
        after the last step run."""
        key_ = ("decode", search.do_sample)
        if key_ not in self._programs:
            self._programs[key_] = self._jit(self._decode_fn(search), donate=(1, 2))
        return self._programs[key_]

    def _jit(self, fn: Callable, donate: tuple[int, ...]) -> Callable:
        if self.placement is not None:
            return self.placement.jit(fn, donate)
        return jax.jit(fn, donate_argnums=donate)

    def _prefill_fn(self, search: Search) -> Callable:
        layout = self.layout

        def prefill(params, cache, ids, lengths, sampling):
            self.traces["prefill"] += 1
            batch, width = ids.shape
            capacity = max(c.shape[2] for c in cache)  # ring caches are shorter
            columns = jnp.arange(width, dtype=jnp.int32)[None]
            if layout.kind == "shared":  # right-padded; the mask spans the whole buffer
                mask = jnp.arange(capacity, dtype=jnp.int32)[None] < lengths[:, None]
                logits, presents = self._forward(params, cache, **self._named(ids, mask, columns))
                last = jnp.take_along_axis(logits, (lengths - 1)[:, None, None], axis=1)[:, 0]
                cache = tuple(self._constrain(p) for p in presents)
                state = {}
            else:  # left-padded; the past is empty, its present copied into the buffer
                prompt_mask = columns >= (width - lengths)[:, None]
                positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
                empty = tuple(jnp.zeros((*c.shape[:2], 0, c.shape[3]), c.dtype) for c in cache)
                logits, presents = self._forward(params, empty, **self._named(ids, prompt_mask, positions))
                last = logits[:, -1]
                cache = tuple(
                    self._constrain(jax.lax.dynamic_update_slice(c, p.astype(c.dtype), (0, 0, 0, 0)))
                    for c, p in zip(cache, presents)
                )
                buffer_mask = jnp.zeros((batch, capacity), bool).at[:, :width].set(prompt_mask)
                state = {"mask": buffer_mask, "slot": jnp.int32(width)}
            state.update(sampling, lengths=lengths, done=jnp.zeros((batch,), bool), step=jnp.int32(0))
            token, done = self._pick(last, state, search)
            state.update(done=done, step=jnp.int32(1))
            return cache, state, token

        return prefill

    def _decode_fn(self, search: Search) -> Callable:
        step = self._step_fn(search)

        def decode(params, cache, state, token, count):
            self.traces["decode"] += 1
            tokens = jnp.full((token.shape[0], DECODE_STEPS), state["pad"], jnp.int32)

            def more(carry):
                done, state = carry[0], carry[2]
                return (done < count) & ~jnp.all(state["done"])

            def one(carry):
                done, cache, state, token, tokens = carry
                cache, state, token = step(params, cache, state, token)
                tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (jnp.int32(0), done))
                return done + 1, cache, state, token, tokens

            carry = (jnp.int32(0), cache, dict(state), token, tokens)
            _, cache, state, token, tokens = jax.lax.while_loop(more, one, carry)
            return cache, state, token, tokens

        return decode

    def _step_fn(self, search: Search) -> Callable:
        """One decode step ``(params, cache, state, token [B]) -> (cache, state, next token [B])``."""
        layout = self.layout

        def step(params, cache, state, token):
            state = dict(state)
            batch = token.shape[0]
            capacity = max(c.shape[2] for c in cache)  # ring caches are shorter
            ids = token[:, None]
            positions = state["lengths"][:, None]
            if layout.kind == "shared":
                mask = jnp.arange(capacity, dtype=jnp.int32)[None] < (state["lengths"] + 1)[:, None]
                logits, presents = self._forward(params, cache, **self._named(ids, mask, positions))
                cache = tuple(self._constrain(p) for p in presents)
            else:
                mask = jnp.concatenate([state["mask"], jnp.ones((batch, 1), bool)], axis=1)
                logits, presents = self._forward(params, cache, **self._named(ids, mask, positions))
                slot = state["slot"]
                zero = jnp.zeros((), slot.dtype)
                at = (zero, zero, slot, zero)
                cache = tuple(
                    self._constrain(jax.lax.dynamic_update_slice(c, p[:, :, -1:].astype(c.dtype), at))
                    for c, p in zip(cache, presents)
                )
                state["mask"] = jax.lax.dynamic_update_slice(state["mask"], jnp.ones((batch, 1), bool), (zero, slot))
                state["slot"] = slot + 1
            state["lengths"] = state["lengths"] + 1
            token, state["done"] = self._pick(logits[:, -1], state, search)
            state["step"] = state["step"] + 1
            return cache, state, token

        return step

    def _constrain(self, cache_array: jax.Array) -> jax.Array:
        """A cache array kept where the placement puts the cache (as it came in: donated and reused)."""
        if self.placement is not None:
            return self.placement.constrain_cache(cache_array)
        return cache_array

    def recompute(self, search: Search) -> Callable:
        """For a model without a cache: ``(params, ids [B, n] left-padded, mask [B, n], state) -> (next token
        [B], done)`` with state ``{"done", "step"}`` and the sampling of :meth:`prefill`; the whole sequence
        each call (quadratic; one compile per length n)."""
        key_ = ("recompute", search.do_sample)
        if key_ not in self._programs:

            def recompute(params, ids, mask, state):
                self.traces["recompute"] += 1
                positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
                logits, _ = self._forward(params, (), **self._named(ids, mask, positions))
                return self._pick(logits[:, -1], state, search)

            self._programs[key_] = jax.jit(recompute)
        return self._programs[key_]


def _model_file(path: str) -> str:
    """The .onnx file of ``path``: itself, or a folder's model.onnx."""
    if os.path.isdir(path):
        candidate = os.path.join(path, "model.onnx")
        if not os.path.isfile(candidate):
            raise FileNotFoundError(f"{path}: no genai_config.json and no model.onnx in the folder")
        return candidate
    return path
