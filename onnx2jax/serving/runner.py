"""The model runner: the decoder's forward over a fixed set of slots and a KV cache in pages.

The cache is stored in pages: for every cache input of the graph (keys and values of each layer) one array
``[pages + 1, kv_heads, page_size, head_size]``; the last page is a scratch page that writes nobody owns go to
(padding, idle slots). A request holds a block table (its pages in order), so its position ``i`` lives at
offset ``i % page_size`` of page ``block[i // page_size]``. A call's block tables are ``width`` pages wide: the
pages the longest request of the call needs, rounded up to a power of two (at least `MIN_WINDOW` positions), so
that a call's cost follows the requests' lengths rather than the context.

How attention meets the pages:

- GroupQueryAttention (onnxruntime-genai's builder graphs, layout ``"shared"``): lowered onto the pages. The
  program traces the graph inside :func:`onnx2jax.ops.contrib_attention.paged_cache`, passing each cache
  input's pages as the past: every GroupQueryAttention writes its new keys and values straight into their pages
  through the block table (one scatter; a chunk's padding and idle rows write to the scratch page) and reads
  each row's keys and values through it (one gather) for its attention, masked by each row's length; its present
  is the updated pages. No contiguous copy of the cache is kept or scattered back. This is neither
  onnxruntime-genai's paged engine nor a fused paged-attention kernel (XLA has none on CPU): the gather of the
  rows' pages is a transient of one layer of one step.
- Graphs that concatenate past and new (torch exports, ``"concat"``; no attention op to lower): each program
  gathers the slots' pages into a contiguous view ``[slots, kv_heads, window, head_size]``, passes it to the
  model as the past with the attention mask saying which positions hold tokens, and scatters only the present's
  new positions (its last ones) back into the request's own pages.

Two programs, each compiled once per (rows, block-table width) for the runner's page size and chunk (at most
log2(context / page size) + 1 widths; the decode's rows a power of four below the slots or the slots, as many
as the highest slot in use needs, so that one request alone runs one row), all of them by :meth:`ModelRunner.warm`
before serving:

- ``prefill``: a chunk of up to ``chunk`` tokens of each of up to ``prefill_rows`` requests (one row each,
  right-padded; idle rows write to the scratch page; one row where one request prefills, the common case when
  requests arrive one by one); a row's last real token's logits choose its next token when it is the prompt's
  last chunk.
- ``decode``: one token for every slot of the step's rows (idle ones write to the scratch page and their
  tokens are ignored); ``decode_many``, where the engine asks for it, ``decode_steps`` such steps in one call
  (a scan: each row's chosen token is the next step's input), each row stopping where the caller says (its
  ``max_tokens`` or the context; a row past its eos runs on, into its own pages, and the engine drops those
  tokens). It saves the per-call cost (the dispatch, the transfers, XLA's per-execution work) of all but one
  step, but its tokens come to the host together at the call's end.

Both take the pages and the slots' seen-token table (for the repetition penalty) donated, and everything else a
step needs (block tables, lengths, tokens, per-slot sampling parameters as data, :mod:`onnx2jax.serving.sampler`)
packed into one int32 array (floats as their bits): one transfer to the device per call, one token per row
back. Tensor-parallel, the pages are split on their KV-heads axis over the mesh axes the plan splits the cache
over, so each device writes and reads only its own heads' pages.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.ops.contrib_attention import paged_cache
from onnx2jax.serving import sampler
from onnx2jax.serving.sampler import IDLE_COLUMNS, SAMPLING_FIELDS
from onnx2jax.serving.source import ModelSource
from onnx2jax.xla_options import compiler_options

MIN_WINDOW = 64
"""The fewest positions a call's view spans (short requests share one program)."""

class ModelRunner:
    """The paged cache and the compiled prefill and decode programs (module docstring).

    Args:
      source: the model (:class:`~onnx2jax.serving.source.ModelSource`).
      slots: rows of the decode batch.
      num_pages: pages of the cache (the scratch page comes on top).
      page_size: positions per page.
      pages_per_slot: the most pages one request holds (its block table's width).
      chunk: the prefill's width.
      prefill_rows: requests the prefill takes at once.
      decode_steps: the steps of the decode program that runs several in one call (1: none such).

    Attributes:
      pages: the cache, one ``[num_pages + 1, kv_heads, page_size, head_size]`` array per cache input.
      traces: how many times each program was traced: once per (rows, block-table width) used.
      widths: the (program, rows, block-table width) triples traced; ``"decode_many"`` is the decode of
        ``decode_steps`` steps.
    """

    def __init__(self, source: ModelSource, *, slots: int, num_pages: int, page_size: int, pages_per_slot: int,
                 chunk: int, prefill_rows: int = 1, decode_steps: int = 1):
        layout = source.layout
        if layout.kv_heads is None or layout.head_size is None:
            raise ValueError(f"{layout.source}: the cache's KV heads and head size are not fixed by the graph")
        self.source, self.layout = source, layout
        self.slots, self.num_pages, self.page_size = slots, num_pages, page_size
        self.pages_per_slot, self.chunk, self.prefill_rows = pages_per_slot, chunk, prefill_rows
        self.scratch = num_pages  # the page index nobody owns
        shape = (num_pages + 1, layout.kv_heads, page_size, layout.head_size)
        # On the handle's mesh, the pages split by KV heads as the plan splits the cache (whole on one device).
        self._page_sharding = NamedSharding(source.mesh, PartitionSpec(None, source.heads_axes, None, None))
        self._view_sharding = NamedSharding(source.mesh, PartitionSpec(None, source.heads_axes, None, None))
        seen_sharding = NamedSharding(source.mesh, PartitionSpec())
        if source.target is not None:  # nothing to place on: the cache's shapes and shardings, for lower()
            self.pages = tuple(jax.ShapeDtypeStruct(shape, jnp.dtype(layout.dtype), sharding=self._page_sharding)
                               for _ in layout.past)
            self.seen = jax.ShapeDtypeStruct((slots, source.vocab_size), jnp.bool_, sharding=seen_sharding)
        else:
            with source.x64():
                zeros = jax.jit(lambda: jnp.zeros(shape, layout.dtype), out_shardings=self._page_sharding)
                self.pages = tuple(zeros() for _ in layout.past)
                self.seen = jax.device_put(np.zeros((slots, source.vocab_size), bool), seen_sharding)
        self.decode_steps = decode_steps
        counts = [1]
        while counts[-1] * 4 < slots:
            counts.append(counts[-1] * 4)
        self._row_counts = sorted(set(counts) | {slots})
        self.traces = {"prefill": 0, "decode": 0} | ({"decode_many": 0} if decode_steps > 1 else {})
        self.widths: set[tuple[str, int, int]] = set()
        platform = source.mesh.devices.flat[0].platform
        options = compiler_options(platform)  # as every onnx2jax executable's
        self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1, 2), compiler_options=options)
        # several steps a call loop over the pages: updated in place, as the Generator's decode loop
        # (xla_options.IN_PLACE_LOOP_FLAG; without it XLA CPU copied every page array twice a step on torch exports)
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1, 2), static_argnums=4,
                               compiler_options=compiler_options(platform, in_place_loops=True))

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over every cache input."""
        layout = self.layout
        return len(layout.past) * layout.kv_heads * self.page_size * layout.head_size * np.dtype(layout.dtype).itemsize

    # ---- host side

    @property
    def row_counts(self) -> list[int]:
        """The decode step's row counts: powers of four below the slots, and the slots."""
        return list(self._row_counts)

    @property
    def prefill_row_counts(self) -> list[int]:
        """The prefill's row counts: 1 (a newcomer alone, the common case, pays for one row) and ``prefill_rows``."""
        return sorted({1, self.prefill_rows})

    def rows_for(self, highest_slot: int) -> int:
        """The rows a decode step runs when ``highest_slot`` is the highest slot in use."""
        return next(r for r in self._row_counts if r > highest_slot)

    @property
    def block_widths(self) -> list[int]:
        """Every block-table width a call can have (:meth:`_width`)."""
        widths = [self._width(1)]
        while widths[-1] < self.pages_per_slot:
            widths.append(min(widths[-1] * 2, self.pages_per_slot))
        return widths

    def warm(self) -> None:
        """Compiles every program shape serving can meet (each block-table width; the decode's at each row count)
        with idle rows that write only to the scratch page, so that no request waits for a compile."""
        for width in self.block_widths:
            for rows in self.prefill_row_counts:
                self.prefill([], width=width, rows=rows)
            for rows in self.row_counts:
                for steps in sorted({1, self.decode_steps}):
                    self.decode([None] * rows, [0] * rows, [0] * rows, [None] * rows, width=width, steps=steps)

    def prefill(self, chunks: list[tuple[int, list[int], int, list[int], np.ndarray]],
                width: int | None = None, rows: int | None = None) -> list[int]:
        """Writes each chunk ``(slot, block, start, ids, columns)`` (at most ``prefill_rows`` of them, ids at most
        ``chunk``; ``columns``: the request's :func:`~onnx2jax.serving.sampler.sampling_columns` row): ``ids`` at positions ``start..`` of the
        request in ``slot`` whose pages are ``block``; returns each chunk's token chosen from its last id's logits
        (the caller keeps it only after the prompt's last chunk). ``width``: the block tables' (default: as the
        chunks need); ``rows``: the program's (default: the fewest of :attr:`prefill_row_counts` that hold the
        chunks)."""
        self._check_attached("run a prefill")
        rows = rows or next(r for r in self.prefill_row_counts if r >= len(chunks))
        c = self.chunk
        width = width or self._width(max((start for _, _, start, _, _ in chunks), default=0) + c)
        packed = np.zeros((rows, width + c + 3 + SAMPLING_FIELDS), np.int32)
        packed[:, :width] = self.scratch
        packed[:, width + c + 2] = self.slots  # idle rows: a slot past the end, dropped
        packed[:, width + c + 3:] = IDLE_COLUMNS
        for i, (slot, block, start, chunk_ids, columns) in enumerate(chunks):
            packed[i, : min(len(block), width)] = block[:width]
            packed[i, width: width + len(chunk_ids)] = chunk_ids
            packed[i, width + c: width + c + 3] = start, len(chunk_ids), slot
            packed[i, width + c + 3:] = columns
        with self.source.x64():
            self.pages, self.seen, tokens = self._prefill(self.source.params, self.pages, self.seen, packed)
            return np.asarray(tokens)[: len(chunks)].tolist()

    def decode(self, blocks: list[list[int] | None], lengths: list[int], tokens: list[int],
               rows: list[np.ndarray | None], width: int | None = None, steps: int = 1,
               steps_left: list[int] | None = None) -> np.ndarray:
        """``steps`` steps of the first ``len(blocks)`` slots (one of :attr:`row_counts`) in one call: at each
        step k, slot i (None: idle) writes its token at position ``lengths[i] + k`` of its pages ``blocks[i]``
        (``tokens[i]`` first, then the token it chose at step k - 1) and chooses its next token with its
        sampling columns ``rows[i]`` (:func:`~onnx2jax.serving.sampler.sampling_columns`), while k < ``steps_left[i]`` (default: every
        step; after, it writes to the scratch page). Returns the chosen tokens, int32 [steps, len(blocks)].
        ``width``: the block tables' (default: as the longest request needs)."""
        self._check_attached("run a decode step")
        n = len(blocks)
        left = [steps if b is not None else 0 for b in blocks] if steps_left is None else steps_left
        longest = max((k + s for b, k, s in zip(blocks, lengths, left) if b is not None), default=1)
        width = width or self._width(longest)
        packed = np.empty((n, width + 3 + SAMPLING_FIELDS), np.int32)
        packed[:, :width] = self.scratch
        packed[:, width + 2] = 0
        packed[:, width + 3:] = IDLE_COLUMNS
        for i, block in enumerate(blocks):
            if block is not None:
                packed[i, : min(len(block), width)] = block[:width]
                packed[i, width + 2] = left[i]
                packed[i, width + 3:] = rows[i]
        packed[:, width] = lengths
        packed[:, width + 1] = tokens
        with self.source.x64():
            self.pages, self.seen, chosen = self._decode(self.source.params, self.pages, self.seen, packed, steps)
            return np.asarray(chosen)

    def lower(self, kind: str, rows: int, width: int, steps: int = 1) -> jax.stages.Lowered:
        """The ``"prefill"`` or ``"decode"`` program at ``rows`` rows and a block table ``width`` pages wide
        (``steps`` decode steps a call), lowered over the cache and the parameters as they are held, nothing run:
        a target's (:attr:`ModelSource.target`) as ShapeDtypeStructs with their shardings."""
        columns = width + self.chunk + 3 if kind == "prefill" else width + 3
        packed = jax.ShapeDtypeStruct((rows, columns + SAMPLING_FIELDS), jnp.int32)
        with self.source.x64():
            if kind == "prefill":
                return self._prefill.lower(self.source.params, self.pages, self.seen, packed)
            if kind == "decode":
                return self._decode.lower(self.source.params, self.pages, self.seen, packed, steps)
        raise ValueError(f"kind must be 'prefill' or 'decode', got {kind!r}")

    def _check_attached(self, action: str) -> None:
        """Refuses to run for a target whose devices are not attached, naming it."""
        if self.source.target is not None:
            from onnx2jax.errors import NoDevicesError

            raise NoDevicesError(self.source.target, action)

    def _width(self, positions: int) -> int:
        """The block-table width of a call whose rows reach ``positions``: a power of two of pages, at least
        `MIN_WINDOW` positions and the chunk (fewer compiles for short requests), at most ``pages_per_slot``."""
        pages = -(-max(positions, MIN_WINDOW, self.chunk) // self.page_size)
        return min(self.pages_per_slot, 1 << max(pages - 1, 0).bit_length())

    # ---- traced

    @staticmethod
    def _constrain(array: jax.Array, sharding: Any) -> jax.Array:
        return jax.lax.with_sharding_constraint(array, sharding)

    def _view(self, pages: jax.Array, table: jax.Array) -> jax.Array:
        """The slots' pages in order: [B, kv_heads, window, head_size] (the ``"concat"`` path)."""
        b, m = table.shape
        view = jnp.transpose(pages[table], (0, 2, 1, 3, 4)).reshape(b, pages.shape[1], m * self.page_size,
                                                                    pages.shape[3])
        return self._constrain(view, self._view_sharding)

    def _write(self, pages: jax.Array, table: jax.Array, positions: jax.Array, valid: jax.Array,
               new: jax.Array) -> jax.Array:
        """``new`` [B, kv_heads, C, head] written at ``positions`` [B, C] of each row's pages; invalid ones
        to the scratch page (the ``"concat"`` path)."""
        index = jnp.minimum(positions // self.page_size, table.shape[1] - 1)
        page = jnp.where(valid, jnp.take_along_axis(table, index, axis=1), self.scratch)
        pages = pages.at[page, :, positions % self.page_size].set(jnp.transpose(new, (0, 2, 1, 3)).astype(pages.dtype))
        return self._constrain(pages, self._page_sharding)

    def _run(self, params, pages, table, ids, starts, counts):
        """The model on ``ids`` [B, C] at positions ``starts + arange(C)`` over the paged past: (the logits of
        each row's last real token, its ``counts``-th, [B, vocabulary] (where the graph lets it the LM head
        projects no other position: :class:`~onnx2jax.serving.source.ModelSource`), pages with the ``counts``
        real tokens' keys and values written)."""
        layout = self.layout
        b, c = ids.shape
        columns = jnp.arange(c, dtype=jnp.int32)[None]
        positions = starts[:, None] + columns
        valid = columns < counts[:, None]
        # a decode step's one position is a constant: XLA then reads it without a gather
        last = jnp.maximum(counts - 1, 0) if c > 1 else jnp.zeros_like(counts)
        window = jnp.arange(table.shape[1] * self.page_size, dtype=jnp.int32)[None]
        named = {layout.input_ids: ids}
        if layout.position_ids is not None:
            named[layout.position_ids] = positions
        if layout.kind == "shared":
            # GroupQueryAttention reads and writes the pages itself (module docstring). The chunk's padding
            # counts as tokens: the op puts the new tokens at total - width, so they start at `starts`;
            # causality keeps the real ones from seeing the pads, which write to the scratch page.
            if layout.attention_mask is not None:
                named[layout.attention_mask] = window < (starts + c)[:, None]
            with paged_cache(table, valid, self.scratch):
                logits, presents = self.source.forward(params, pages, last, **named)
            return logits, tuple(self._constrain(p, self._page_sharding) for p in presents)
        if layout.attention_mask is not None:
            named[layout.attention_mask] = jnp.concatenate([window < starts[:, None], jnp.ones((b, c), bool)], axis=1)
        views = tuple(self._view(p, table) for p in pages)
        logits, presents = self.source.forward(params, views, last, **named)
        written = tuple(self._write(page, table, positions, valid, present[:, :, -c:])
                        for page, present in zip(pages, presents))
        return logits, written

    def _prefill_fn(self, params, pages, seen, packed):
        self.traces["prefill"] += 1
        c = self.chunk
        width = packed.shape[1] - c - 3 - SAMPLING_FIELDS
        self.widths.add(("prefill", packed.shape[0], width))
        table, ids = packed[:, :width], packed[:, width: width + c]
        starts, counts, slots = packed[:, width + c], packed[:, width + c + 1], packed[:, width + c + 2]
        logits, pages = self._run(params, pages, table, ids, starts, counts)
        real = jnp.arange(c)[None] < counts[:, None]
        mine = jnp.minimum(slots, self.slots - 1)  # idle rows read some slot; their writes are dropped
        before = jnp.where((starts == 0)[:, None], False, seen[mine])
        onehot = jnp.zeros_like(before).at[jnp.arange(ids.shape[0])[:, None], ids].max(real)
        rows_seen = before | onehot
        seen = seen.at[slots].set(rows_seen, mode="drop")
        return pages, seen, sampler.pick(logits, rows_seen, packed[:, width + c + 3:])

    def _decode_fn(self, params, pages, seen, packed, steps):
        kind = "decode" if steps == 1 else "decode_many"
        self.traces[kind] += 1
        width = packed.shape[1] - 3 - SAMPLING_FIELDS
        self.widths.add((kind, packed.shape[0], width))
        table, lengths, tokens, left = (packed[:, :width], packed[:, width], packed[:, width + 1],
                                        packed[:, width + 2])
        n = tokens.shape[0]

        def one(carry, k):
            pages, seen, tokens = carry
            active = k < left
            logits, pages = self._run(params, pages, table, tokens[:, None], lengths + k, active.astype(jnp.int32))
            seen = seen.at[jnp.arange(n), tokens].max(active)
            chosen = sampler.pick(logits, seen[:n], packed[:, width + 3:], step=k)
            return (pages, seen, chosen), chosen

        if steps == 1:  # no loop around the one step: XLA sees it whole
            (pages, seen, _), chosen = one((pages, seen, tokens), jnp.int32(0))
            return pages, seen, chosen[None]
        (pages, seen, _), chosen = jax.lax.scan(one, (pages, seen, tokens), jnp.arange(steps, dtype=jnp.int32))
        return pages, seen, chosen
