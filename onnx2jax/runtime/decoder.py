"""A decoder LLM ready to generate: its model, cache layout, parameters on device and compiled steps.

:class:`Decoder` holds a model compiled once (made by :func:`onnx2jax.load`, :mod:`onnx2jax.runtime.load`) and its
cache layout (:mod:`onnx2jax.runtime.kv_cache`), and compiles two programs per (batch, capacity): the prefill (the
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

from typing import Any, Callable, ContextManager, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.runtime import generate_inputs, host_memory, kv_cache
from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.generate_sharding import CachePlacement
from onnx2jax.runtime.logit_positions import LOGIT_POSITIONS, fill_logit_positions
from onnx2jax.runtime.sampling import Search, choose, penalize, seen_tokens
from onnx2jax.runtime.plan import Plan, ProgramPlan, whole_program
from onnx2jax.runtime.spmd import Compiled
from onnx2jax.runtime.total_length import TOTAL_LENGTH, fill_total_length
from onnx2jax.xla_options import compiler_options
from onnx2jax.translate import JaxModel

State = dict[str, jax.Array]

PREFILL_BUCKET = 16
"""Prompt widths are rounded up to a multiple of this for a right-padded prefill (one compile per bucket)."""

DECODE_STEPS = 16
"""The most decode steps one call of the decode program runs (its tokens buffer's width). Streaming gets the
tokens of a call at once: at most this many steps late."""


class Decoder:
    """A decoder LLM loaded once: the handle onnxruntime-genai's users know as ``og.Model``.

    Made by :func:`onnx2jax.load` (:mod:`onnx2jax.runtime.load`) from the one plan: the model opened once (its
    weights memory-mapped, placed slice by slice), translated once, planned once (the Megatron plan and the
    cache's specs written into it where it runs tensor-parallel), compiled through the front door as a
    :class:`~onnx2jax.runtime.spmd.Compiled`. An :class:`~onnx2jax.runtime.executable.Executable` (``params``,
    ``__call__``, ``apply``, ``lower`` and ``report`` are its compiled model's: one forward call with an
    explicit past), extended with the generation programs :meth:`prefill` and :meth:`decode` (jitted over
    ``apply``, so they run the same plan, placements and constraints), which it keeps while it lives.

    The programs close over the compiled model, never over the handle: dropping the last reference to a
    handle frees it, its programs and its device arrays at once (no garbage collection needed).

    Attributes:
      layout: the cache layout (:class:`~onnx2jax.runtime.kv_cache.CacheLayout`).
      devices: the tensor-parallel width (1: one device).
      traces: how many times each program was traced (``"prefill"``, ``"decode"``, ``"recompute"``): a
        program traced once per (batch, capacity) compiled once.
    """

    def __init__(self, model: JaxModel, plan: Plan, layout: kv_cache.CacheLayout, devices: int):
        """``model`` translated from ``plan`` (a ``"whole"`` one); its program planned and its parameters
        placed now where ``plan`` has it, else (tensor-parallel) at the first prefill's shapes
        (:meth:`plan_prefill`) or the first use of :attr:`compiled`, whichever comes first."""
        self.layout = layout
        self.devices = devices
        self._model, self._plan = model, plan
        self._compiled: Compiled | None = None
        self._placement: CachePlacement | None = None
        if plan.program is not None:
            self._place(plan.program)
        self.vocab = generate_inputs.vocabulary(model.index_check.uses, layout.input_ids, layout.vocab_size)
        """The token ids the prompts may hold (:func:`~onnx2jax.runtime.generate_inputs.vocabulary`)."""
        self.traces = {"prefill": 0, "decode": 0, "recompute": 0}
        self._programs: dict[tuple, Program] = {}

    def _place(self, program: ProgramPlan) -> tuple[Compiled, CachePlacement]:
        """The program compiled from ``program`` (its parameters placed) and its cache's placement, kept."""
        self._compiled = Compiled(self._model, program)
        self._placement = CachePlacement(self._compiled, self.layout)
        return self._compiled, self._placement

    def _placed(self) -> tuple[Compiled, CachePlacement]:
        """:meth:`_place`'d, at the model's own shapes where no prefill planned it first."""
        if self._compiled is None or self._placement is None:
            return self._place(whole_program(self._plan))
        return self._compiled, self._placement

    @property
    def compiled(self) -> Compiled:
        """The model as one SPMD program (on one device: a mesh of one), its parameters placed."""
        return self._placed()[0]

    @property
    def placement(self) -> CachePlacement:
        """Where the cache lives (:class:`~onnx2jax.runtime.generate_sharding.CachePlacement`; its ``note``
        says how a cache whose KV heads the devices do not divide is placed)."""
        return self._placed()[1]

    def plan_prefill(self, batch: int, width: int, capacity: int) -> None:
        """Plans the program at the shapes of a prefill of ``batch`` prompts ``width`` wide into a cache of
        ``capacity`` positions, unless it is planned already: the sharding inference that prefill needs is then
        the plan's own (one inference before the first token, not one at the model's shapes and another at the
        prefill's)."""
        if self._compiled is None and self.layout.kv_heads is not None and self.layout.head_size is not None:
            self._place(whole_program(self._plan, self._prefill_shapes(batch, width, capacity)))

    def _prefill_shapes(self, batch: int, width: int, capacity: int) -> dict[str, tuple[int, ...]]:
        """The model's input shapes in a prefill of ``batch`` prompts ``width`` wide into a cache of ``capacity``
        positions: those of the feed the prefill builds (:func:`_prefill_feed`, :func:`_model_feed`), taken with
        ``jax.eval_shape`` (a shape that differed from the call's would cost a second inference at the call:
        ``ProgramPlan.at_shapes`` compares them)."""
        layout = self.layout
        reads = {i.name: i.dtype for i in self._model.inputs}

        def feed(ids, lengths, cache):
            named, past, at, _ = _prefill_feed(layout, reads, ids, lengths, cache)
            return _model_feed(layout, reads, past, at, named)

        cache = tuple(jax.ShapeDtypeStruct(shape, jnp.dtype(layout.dtype))
                      for shape in layout.cache_shapes(batch, capacity))
        rows = jax.ShapeDtypeStruct((batch,), jnp.int32)
        shapes = jax.eval_shape(feed, jax.ShapeDtypeStruct((batch, width), jnp.int32), rows, cache)
        return {name: tuple(value.shape) for name, value in shapes.items()}

    # ---- the Executable face: the compiled model's

    @property
    def model(self) -> JaxModel:
        """The translated model (the compiled program's)."""
        return self._model

    @property
    def params(self) -> dict[str, jax.Array]:
        """The parameters as placed (each device holding its slice)."""
        return self.compiled.params

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """One forward call of the model, cache inputs given explicitly (its token ids checked, as every
        executable checks them)."""
        return self.compiled(*inputs, **self._filled(inputs, named))

    def apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The model as a pure function of ``params`` (``Compiled.apply``), sharded as compiled."""
        return self.compiled.apply(params, *inputs, **self._filled(inputs, named))

    def lower(self, *inputs: Any, **named: Any) -> jax.stages.Lowered:
        """One forward call's lowered program (``Compiled.lower``); a generation program's: ``decode(...).lower``."""
        return self.compiled.lower(*inputs, **self._filled(inputs, named))

    def report(self, *inputs: Any, **named: Any) -> Any:
        """What one forward call's compiled program does (``Compiled.report``)."""
        return self.compiled.report(*inputs, **self._filled(inputs, named))

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple]:
        """``Compiled.value_and_grad`` of one forward call (cache inputs given explicitly, as :meth:`apply`'s)."""
        grad = self.compiled.value_and_grad(loss_fn)

        def run(params: Mapping[str, Any], *inputs: Any, loss_args: Any = (), **named: Any) -> tuple:
            return grad(params, *inputs, loss_args=loss_args, **self._filled(inputs, named))

        return run

    def _filled(self, inputs: tuple, named: Mapping[str, Any]) -> Mapping[str, Any]:
        """``named`` with the inputs the handle added to the graph filled in as the graph computed without them,
        so that a call runs the model as onnxruntime does: the total length a rewired LongRoPE If reads
        (:mod:`onnx2jax.runtime.total_length`) as the mask's width, and the positions the LM head projects
        (:mod:`onnx2jax.runtime.logit_positions`) as every position."""
        names = self._model.input_names
        if TOTAL_LENGTH in names:
            named = fill_total_length(names, self.layout.attention_mask, inputs, named)
        if LOGIT_POSITIONS in names:
            named = fill_logit_positions(names, self.layout.input_ids, inputs, named)
        return named

    def check_ids(self, ids: Any) -> None:
        """Refuses token ids beyond the vocabulary, as a call of the model would (:mod:`onnx2jax.input_checks`).

        Raises:
          InputRangeError: an id indexes beyond the embedding table (naming the input and node).
        """
        self._model.index_check.call((), {self.layout.input_ids: np.asarray(ids)})

    # ---- the cache

    def empty_cache(self, batch: int, capacity: int) -> tuple[jax.Array, ...]:
        """Zeros for every cache input, ``[batch, kv_heads, capacity, head_size]``, made on the device(s) where
        the plan places the cache."""
        if self.layout.kv_heads is None or self.layout.head_size is None:
            shape = (batch, self.layout.kv_heads, capacity, self.layout.head_size)
            raise ValueError(f"the cache's KV heads and head size are not fixed by the graph: {shape}")
        return self.placement.zeros_cache(batch, capacity)

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

    # ---- the programs

    def x64(self) -> ContextManager:
        """The 64-bit context of this model (:func:`~onnx2jax.x64.x64_scope`); the programs
        enter it themselves."""
        return x64_scope(self._model.uses_64bit)

    def prefill(self, search: Search) -> Program:
        """The prefill program: ``(params, cache, ids [B, P] int32, lengths [B] int32, sampling) -> (cache,
        state, first token [B])``; ids padded on the layout's side, lengths the real prompt lengths, sampling
        ``{"key": PRNG key, "eos": int32 [n], "pad": int32 []}`` and :meth:`Search.values` (data: another eos,
        temperature, top-k or top-p compiles nothing; ``search.do_sample`` is the program's)."""
        return self._program("prefill", search, donate=(1,))

    def decode(self, search: Search) -> Program:
        """The decode program: ``(params, cache, state, token [B], count int32 []) -> (cache, state, last token
        [B], tokens [B, DECODE_STEPS] int32)``: ``count`` steps (at most `DECODE_STEPS`) from ``token``, or fewer
        where every row is done (at eos) before; column i of ``tokens`` is step i's token of each row, pad_token_id
        after the last step run."""
        return self._program("decode", search, donate=(1, 2))

    def recompute(self, search: Search) -> Program:
        """For a model without a cache: ``(params, ids [B, n] left-padded, mask [B, n], state) -> (next token
        [B], done)`` with state ``{"done", "step"}`` and the sampling of :meth:`prefill`; the whole sequence
        each call (quadratic; one compile per length n)."""
        return self._program("recompute", search, donate=())

    def lower_generation(
        self, batch: int, width: int, max_length: int, search: Search | None = None
    ) -> tuple[jax.stages.Lowered, jax.stages.Lowered]:
        """The prefill and decode programs lowered without placing anything (a target's decoder too):
        :func:`~onnx2jax.runtime.generate_lower.lower_generation`."""
        from onnx2jax.runtime.generate_lower import lower_generation

        return lower_generation(self, batch, width, max_length, search)

    def _program(self, kind: str, search: Search, donate: tuple[int, ...]) -> Program:
        key = (kind, search.do_sample, search.penalized)
        found = self._programs.get(key)
        if found is None:
            steps = _Steps(self.compiled, self.layout, self.placement, self.traces, search)
            fn = {"prefill": steps.prefill, "decode": steps.decode, "recompute": steps.recompute}[kind]
            # as every executable's, and the decode loop's cache updated in place (xla_options.IN_PLACE_LOOP_FLAG)
            options = compiler_options(self.compiled.mesh.devices.flat[0].platform, in_place_loops=True)
            jitted = jax.jit(fn, donate_argnums=donate, compiler_options=options)
            weights = self.compiled.model.params.values  # on one CPU device the params alias these maps
            found = self._programs[key] = Program(jitted, self.compiled.model.uses_64bit, weights)
        return found


class Program:
    """A generation program (jitted over the compiled model's ``apply``), called and lowered in the model's
    64-bit scope (:func:`~onnx2jax.x64.x64_scope`, the one place x64 is entered).

    A call that compiles (a new shape signature) compiles ahead of running, with the host memory the compile
    would add to the weights already read given back around it (:mod:`onnx2jax.runtime.host_memory`)."""

    def __init__(self, jitted: Callable, uses_64bit: bool, weights: Callable[[], Iterable[np.ndarray]] = tuple):
        self._jitted, self._uses_64bit, self._weights = jitted, uses_64bit, weights
        self._compiled: set[tuple] = set()

    def __call__(self, *args: Any) -> Any:
        with x64_scope(self._uses_64bit):
            key = _shapes(args[1:])  # the parameters' shapes never change
            if key not in self._compiled:
                host_memory.before_compile(self._weights())
                self._jitted.lower(*args).compile()  # jit's own cache: the call below traces and compiles nothing
                host_memory.after_compile()
                self._compiled.add(key)
            return self._jitted(*args)

    def lower(self, *args: Any) -> jax.stages.Lowered:
        with x64_scope(self._uses_64bit):
            return self._jitted.lower(*args)

    def executables(self) -> int:
        """How many executables this program has compiled (one per shape signature of its arguments)."""
        return self._jitted._cache_size()


def _shapes(args: Any) -> tuple:
    """The shapes and dtypes of ``args``' arrays (a program's signature, less the placements); taken on every
    call of a step, so kept to attribute reads (formatting the dtypes as strings cost ~100 us a call)."""
    return tuple((getattr(a, "shape", None), getattr(a, "dtype", type(a))) for a in jax.tree.leaves(args))


class _Steps:
    """The bodies of the generation programs, over the compiled model (not the handle: no reference cycle)."""

    def __init__(self, compiled: Compiled, layout: kv_cache.CacheLayout, placement: CachePlacement,
                 traces: dict[str, int], search: Search):
        self.compiled, self.layout, self.placement, self.traces, self.search = (
            compiled, layout, placement, traces, search)
        self._dtypes = {i.name: i.dtype for i in compiled.model.inputs}
        self.vocab = generate_inputs.vocabulary(compiled.model.index_check.uses, layout.input_ids, layout.vocab_size)

    def _forward(self, params, cache: tuple, at: jax.Array, **named) -> tuple[jax.Array, tuple]:
        """The model on named inputs (cast to the graph's types) and ``cache`` as the past: (logits at the
        positions ``at`` [B] of each row (the only ones the LM head projects where the graph lets it:
        :mod:`onnx2jax.runtime.logit_positions`) [B, vocabulary], presents)."""
        feed = _model_feed(self.layout, self._dtypes, cache, at, named)
        feed[self.layout.input_ids] = generate_inputs.model_ids(feed[self.layout.input_ids], self.vocab)
        past = set(self.layout.past)
        values = {name: value if name in past or self._dtypes[name] is None else value.astype(self._dtypes[name])
                  for name, value in feed.items()}
        outputs = dict(zip(self.compiled.model.output_names, self.compiled.apply(params, **values)))
        logits = outputs[self.layout.logits]
        if LOGIT_POSITIONS in self._dtypes:
            logits = logits[:, 0]
        else:
            logits = jnp.take_along_axis(logits, at.astype(jnp.int32)[:, None, None], axis=1)[:, 0]
        return logits, tuple(outputs[n] for n in self.layout.present)

    def _named(self, ids, mask, positions, total) -> dict[str, jax.Array]:
        """The model's named inputs of a step (:func:`_named_inputs`)."""
        return _named_inputs(self.layout, self._dtypes, ids, mask, positions, total)

    def _pick(self, logits, state: State):
        """The next token of each row (pad for rows already done) and the rows done after it; where a
        repetition penalty applies, the logits are penalized first and ``state["seen"]`` takes the token."""
        if self.search.penalized:
            logits = penalize(logits.astype(jnp.float32), state["seen"], state["penalty"])
        token = choose(logits, jax.random.fold_in(state["key"], state["step"]), self.search.do_sample, state)
        token = jnp.where(state["done"], state["pad"], token)
        if self.search.penalized:
            state["seen"] = state["seen"].at[jnp.arange(token.shape[0]), token].set(True, mode="drop")
        return token, state["done"] | jnp.isin(token, state["eos"])

    def _seen(self, ids, valid, logits) -> dict[str, jax.Array]:
        """``{"seen": the prompt's tokens [B, V]}`` where a repetition penalty applies, else nothing."""
        return {"seen": seen_tokens(ids, valid, logits.shape[-1])} if self.search.penalized else {}

    def _constrain(self, cache_array: jax.Array) -> jax.Array:
        """A cache array kept where the plan puts the cache (as it came in: donated and reused)."""
        return self.placement.constrain_cache(cache_array)

    def prefill(self, params, cache, ids, lengths, sampling):
        """:meth:`Decoder.prefill`'s body."""
        self.traces["prefill"] += 1
        layout = self.layout
        batch, width = ids.shape
        capacity = max(c.shape[2] for c in cache)  # ring caches are shorter
        named, past, at, prompt_mask = _prefill_feed(layout, self._dtypes, ids, lengths, cache)
        last, presents = self._forward(params, past, at, **named)
        if prompt_mask is None:  # right-padded: the presents are the buffer
            cache = tuple(self._constrain(p) for p in presents)
            state = {}
        else:  # left-padded: the past was empty, its present copied into the buffer
            cache = tuple(
                self._constrain(jax.lax.dynamic_update_slice(c, p.astype(c.dtype), (0, 0, 0, 0)))
                for c, p in zip(cache, presents)
            )
            buffer_mask = jnp.zeros((batch, capacity), bool).at[:, :width].set(prompt_mask)
            state = {"mask": buffer_mask, "slot": jnp.int32(width)}
        columns = jnp.arange(width, dtype=jnp.int32)[None]
        valid = columns < lengths[:, None] if layout.kind == "shared" else columns >= (width - lengths)[:, None]
        state.update(sampling, lengths=lengths, done=jnp.zeros((batch,), bool), step=jnp.int32(0),
                     **self._seen(ids, valid, last))
        token, done = self._pick(last, state)
        state.update(done=done, step=jnp.int32(1))
        return cache, state, token

    def decode(self, params, cache, state, token, count):
        """:meth:`Decoder.decode`'s body: up to ``count`` steps in one ``while_loop``."""
        self.traces["decode"] += 1
        tokens = jnp.full((token.shape[0], DECODE_STEPS), state["pad"], jnp.int32)

        def more(carry):
            done, state = carry[0], carry[2]
            return (done < count) & ~jnp.all(state["done"])

        def one(carry):
            done, cache, state, token, tokens = carry
            cache, state, token = self._step(params, cache, state, token)
            tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (jnp.int32(0), done))
            return done + 1, cache, state, token, tokens

        carry = (jnp.int32(0), cache, dict(state), token, tokens)
        _, cache, state, token, tokens = jax.lax.while_loop(more, one, carry)
        return cache, state, token, tokens

    def _step(self, params, cache, state, token):
        """One decode step ``(params, cache, state, token [B]) -> (cache, state, next token [B])``."""
        layout = self.layout
        state = dict(state)
        batch = token.shape[0]
        at = jnp.zeros((batch,), jnp.int32)
        capacity = max(c.shape[2] for c in cache)  # ring caches are shorter
        ids = token[:, None]
        positions = state["lengths"][:, None]
        if layout.kind == "shared":
            mask = jnp.arange(capacity, dtype=jnp.int32)[None] < (state["lengths"] + 1)[:, None]
            total = jnp.max(state["lengths"]) + 1  # the width onnxruntime-genai's grown mask has
            logits, presents = self._forward(params, cache, at, **self._named(ids, mask, positions, total))
            cache = tuple(self._constrain(p) for p in presents)
        else:
            mask = jnp.concatenate([state["mask"], jnp.ones((batch, 1), bool)], axis=1)
            total = state["slot"] + 1  # the buffer positions written, pads included, and this one
            logits, presents = self._forward(params, cache, at, **self._named(ids, mask, positions, total))
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
        token, state["done"] = self._pick(logits, state)
        state["step"] = state["step"] + 1
        return cache, state, token

    def recompute(self, params, ids, mask, state):
        """:meth:`Decoder.recompute`'s body: the whole sequence, its last position's next token."""
        self.traces["recompute"] += 1
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        last = jnp.full((ids.shape[0],), ids.shape[1] - 1, jnp.int32)
        logits, _ = self._forward(params, (), last, **self._named(ids, mask, positions, ids.shape[1]))
        state = {**state, **self._seen(ids, mask, logits)}
        return self._pick(logits, state)


def _named_inputs(layout: kv_cache.CacheLayout, reads: Mapping[str, Any], ids, mask, positions, total) -> dict:
    """The model's named inputs (those of ``layout`` the graph has); ``total`` the run's total length (the width
    of onnxruntime-genai's mask), fed where the graph reads it (``reads``: its input names;
    :mod:`onnx2jax.runtime.total_length`: LongRoPE's If)."""
    named = {layout.input_ids: ids}
    if layout.attention_mask is not None:
        named[layout.attention_mask] = mask
    if layout.position_ids is not None:
        named[layout.position_ids] = positions
    if TOTAL_LENGTH in reads:
        named[TOTAL_LENGTH] = total
    return named


def _prefill_feed(layout: kv_cache.CacheLayout, reads: Mapping[str, Any], ids, lengths, cache: tuple) -> tuple:
    """A prefill's model inputs from its padded ids [B, P], the prompts' lengths [B] and the cache buffer:
    (named inputs, the past, the position of each row whose logits choose its token [B], the prompt mask of a
    left-padded layout, None for a right-padded one). Right-padded (``"shared"``): the buffer is the past and
    the mask spans it; left-padded: the past is empty (the prefill copies the present into the buffer)."""
    batch, width = ids.shape
    columns = jnp.arange(width, dtype=jnp.int32)[None]
    if layout.kind == "shared":
        capacity = max(c.shape[2] for c in cache)
        mask = jnp.arange(capacity, dtype=jnp.int32)[None] < lengths[:, None]
        # onnxruntime-genai's first mask is as wide as the longest prompt
        return _named_inputs(layout, reads, ids, mask, columns, jnp.max(lengths)), cache, lengths - 1, None
    prompt_mask = columns >= (width - lengths)[:, None]
    positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0)
    empty = tuple(jnp.zeros((*c.shape[:2], 0, c.shape[3]), c.dtype) for c in cache)
    at = jnp.full((batch,), width - 1, jnp.int32)
    return _named_inputs(layout, reads, ids, prompt_mask, positions, width), empty, at, prompt_mask


def _model_feed(layout: kv_cache.CacheLayout, reads: Mapping[str, Any], past: tuple, at, named: Mapping) -> dict:
    """Every model input of a forward call: ``named``, the past entries, and where the graph reads it the
    positions ``at`` [B] the LM head projects (:mod:`onnx2jax.runtime.logit_positions`) as [B, 1, 1]."""
    feed = dict(named)
    if LOGIT_POSITIONS in reads:
        feed[LOGIT_POSITIONS] = at[:, None, None]
    feed.update(zip(layout.past, past))
    return feed


__all__ = ["DECODE_STEPS", "PREFILL_BUCKET", "Decoder", "Program"]
