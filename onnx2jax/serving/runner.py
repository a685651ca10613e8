"""The model runner: the decoder's forward over a fixed set of slots and a KV cache in pages.

The cache is stored in pages: for every cache input of the graph (keys and values of each layer) one array
``[kv_heads, pages + 1, page_size, head_size]``; the last page is a scratch page that writes nobody owns go to
(padding, idle slots). A request holds a block table (its pages in order), so its position ``i`` lives at
offset ``i % page_size`` of page ``block[i // page_size]``.

How attention meets the pages (the graph's own attention runs unchanged): each program gathers the slots'
pages through their block tables into a contiguous view ``[slots, kv_heads, window, head_size]`` (``window``
= the block tables' width × page size; the width is the pages the longest request of the call needs, rounded
up to a power of two, so a call's cost follows the requests' lengths rather than the context), passes it to the model as the past with the attention mask saying how many
positions hold tokens, and scatters only the positions it wrote back into the request's own pages. Where
GroupQueryAttention writes its own cache in place (onnxruntime-genai builder graphs, layout ``"shared"``) it
writes into the view at each row's length; for graphs that concatenate past and new (torch exports,
``"concat"``) the new positions are the present's last ones. This is neither onnxruntime-genai's paged engine
nor a paged-attention kernel: the view is a transient of one step (its size is that of a dense cache of the
slots at full window), the pages are what persists, given per token as a request grows. Lowering
GroupQueryAttention onto the pages directly (reading through the block table) would remove the gather; not done.

Two programs, each compiled once per (rows, block-table width) for the runner's page size and chunk (at most
log2(context / page size) + 1 widths; the decode's rows a power of four below the slots or the slots, as many
as the highest slot in use needs, so that one request alone runs one row), all of them by :meth:`ModelRunner.warm`
before serving:

- ``prefill``: a chunk of up to ``chunk`` tokens of each of up to ``prefill_rows`` requests (one row each,
  right-padded; idle rows write to the scratch page); a row's last real token's logits choose its next token
  when it is the prompt's last chunk.
- ``decode``: one token for every slot of the step's rows (idle ones write to the scratch page and their
  tokens are ignored).

Both take the pages and the slots' seen-token table (for the repetition penalty) donated, and sampling
parameters as per-slot data (:mod:`onnx2jax.serving.sampler`). Tensor-parallel, the pages are split on their
KV-heads axis over the mesh axes the plan splits the cache over (the views likewise), so each device gathers
and writes only its own heads' pages.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.serving import sampler
from onnx2jax.serving.source import ModelSource

MIN_WINDOW = 64
"""The fewest positions a call's view spans (short requests share one program)."""

ROW_KEYS = ("temperature", "top_k", "top_p", "penalty", "seed", "step")
"""The per-row sampling data :func:`onnx2jax.serving.sampler.pick` takes."""

_ROW_DTYPES = {"temperature": np.float32, "top_k": np.int32, "top_p": np.float32, "penalty": np.float32,
               "seed": np.uint32, "step": np.int32}


def row_arrays(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Per-row sampling parameters as the arrays the programs take."""
    return {k: np.array([r[k] for r in rows], _ROW_DTYPES[k]) for k in ROW_KEYS}


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

    Attributes:
      traces: how many times each program was traced: once per block-table width used.
      widths: the (program, rows, block-table width) triples traced.
    """

    def __init__(self, source: ModelSource, *, slots: int, num_pages: int, page_size: int, pages_per_slot: int,
                 chunk: int, prefill_rows: int = 1):
        layout = source.layout
        if layout.kv_heads is None or layout.head_size is None:
            raise ValueError(f"{layout.source}: the cache's KV heads and head size are not fixed by the graph")
        self.source, self.layout = source, layout
        self.slots, self.num_pages, self.page_size = slots, num_pages, page_size
        self.pages_per_slot, self.chunk, self.prefill_rows = pages_per_slot, chunk, prefill_rows
        self.scratch = num_pages  # the page index nobody owns
        shape = (layout.kv_heads, num_pages + 1, page_size, layout.head_size)
        # On the handle's mesh, the pages split by KV heads as the plan splits the cache (whole on one device).
        self._page_sharding = NamedSharding(source.mesh, PartitionSpec(source.heads_axes, None, None, None))
        self._view_sharding = NamedSharding(source.mesh, PartitionSpec(None, source.heads_axes, None, None))
        with source.x64():
            zeros = jax.jit(lambda: jnp.zeros(shape, layout.dtype), out_shardings=self._page_sharding)
            self.pages = tuple(zeros() for _ in layout.past)
            self.seen = jax.device_put(np.zeros((slots, source.vocab_size), bool),
                                       NamedSharding(source.mesh, PartitionSpec()))
        self.traces = {"prefill": 0, "decode": 0}
        self.widths: set[tuple[str, int, int]] = set()
        self._prefill = jax.jit(self._prefill_fn, donate_argnums=(1, 2))
        self._decode = jax.jit(self._decode_fn, donate_argnums=(1, 2))

    @property
    def page_bytes(self) -> int:
        """Bytes of one page over every cache input."""
        layout = self.layout
        return len(layout.past) * layout.kv_heads * self.page_size * layout.head_size * np.dtype(layout.dtype).itemsize

    # ---- host side

    @property
    def row_counts(self) -> list[int]:
        """The decode step's row counts: powers of four below the slots, and the slots."""
        counts = [1]
        while counts[-1] * 4 < self.slots:
            counts.append(counts[-1] * 4)
        return sorted(set(counts) | {self.slots})

    def rows_for(self, highest_slot: int) -> int:
        """The rows a decode step runs when ``highest_slot`` is the highest slot in use."""
        return next(r for r in self.row_counts if r > highest_slot)

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
            self.prefill([], width=width)
            for rows in self.row_counts:
                self.decode([None] * rows, [0] * rows, [0] * rows, [None] * rows, width=width)

    def prefill(self, chunks: list[tuple[int, list[int], int, list[int], dict[str, Any]]],
                width: int | None = None) -> list[int]:
        """Writes each chunk ``(slot, block, start, ids, row)`` (at most ``prefill_rows`` of them, ids at most
        ``chunk``): ``ids`` at positions ``start..`` of the request in ``slot`` whose pages are ``block``;
        returns each chunk's token chosen from its last id's logits (the caller keeps it only after the prompt's
        last chunk). ``width``: the block tables' (default: as the chunks need)."""
        rows = self.prefill_rows
        ids = np.zeros((rows, self.chunk), np.int32)
        starts, counts = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        slots = np.full(rows, self.slots, np.int32)  # idle rows: a slot past the end, dropped
        idle = {k: 0 for k in ROW_KEYS} | {"penalty": 1.0, "top_p": 1.0}
        samples = [idle] * rows
        blocks: list[list[int]] = [[] for _ in range(rows)]
        for i, (slot, block, start, chunk_ids, row) in enumerate(chunks):
            ids[i, : len(chunk_ids)] = chunk_ids
            starts[i], counts[i], slots[i], samples[i], blocks[i] = start, len(chunk_ids), slot, row, block
        with self.source.x64():
            self.pages, self.seen, tokens = self._prefill(
                self.source.params, self.pages, self.seen,
                self._block(width or self._width(int(starts.max()) + self.chunk), *blocks), starts, counts, ids, slots,
                row_arrays(samples),
            )
            return np.asarray(tokens)[: len(chunks)].tolist()

    def decode(self, blocks: list[list[int] | None], lengths: list[int], tokens: list[int],
               rows: list[dict[str, Any] | None], width: int | None = None) -> np.ndarray:
        """One step of the first ``len(blocks)`` slots (one of :attr:`row_counts`): slot i (None: idle) writes
        ``tokens[i]`` at position ``lengths[i]`` of its pages ``blocks[i]`` and chooses its next token; returns
        them, int32 [len(blocks)]. ``width``: the block tables' (default: as the longest request needs)."""
        idle = {k: 0 for k in ROW_KEYS} | {"penalty": 1.0, "top_p": 1.0}
        active = np.array([b is not None for b in blocks])
        longest = max((n + 1 for b, n in zip(blocks, lengths) if b is not None), default=1)
        table = self._block(width or self._width(longest), *[b if b is not None else [] for b in blocks])
        with self.source.x64():
            self.pages, self.seen, chosen = self._decode(
                self.source.params, self.pages, self.seen, table, np.array(lengths, np.int32),
                np.array(tokens, np.int32), active, row_arrays([r if r is not None else idle for r in rows]),
            )
            return np.asarray(chosen)

    def _width(self, positions: int) -> int:
        """The block-table width of a call whose rows reach ``positions``: a power of two of pages, at least
        `MIN_WINDOW` positions and the chunk (fewer compiles for short requests), at most ``pages_per_slot``."""
        pages = -(-max(positions, MIN_WINDOW, self.chunk) // self.page_size)
        return min(self.pages_per_slot, 1 << max(pages - 1, 0).bit_length())

    def _block(self, width: int, *blocks: list[int]) -> np.ndarray:
        """The block tables ``width`` wide (pages past it are not reached by the call), the rest scratch."""
        table = np.full((len(blocks), width), self.scratch, np.int32)
        for i, block in enumerate(blocks):
            table[i, : min(len(block), width)] = block[:width]
        return table

    # ---- traced

    def _view(self, pages: jax.Array, table: jax.Array) -> jax.Array:
        """The slots' pages in order: [B, kv_heads, window, head_size]."""
        gathered = pages[:, table]  # [kv_heads, B, M, page, head]
        b = table.shape[0]
        window = table.shape[1] * self.page_size
        view = jnp.transpose(gathered, (1, 0, 2, 3, 4)).reshape(b, pages.shape[0], window, pages.shape[3])
        return self._constrain(view, self._view_sharding)

    @staticmethod
    def _constrain(array: jax.Array, sharding: Any) -> jax.Array:
        return jax.lax.with_sharding_constraint(array, sharding)

    def _write(self, pages: jax.Array, table: jax.Array, positions: jax.Array, valid: jax.Array,
               new: jax.Array) -> jax.Array:
        """``new`` [B, kv_heads, C, head] written at ``positions`` [B, C] of each row's pages; invalid ones
        to the scratch page."""
        index = jnp.minimum(positions // self.page_size, table.shape[1] - 1)
        page = jnp.where(valid, jnp.take_along_axis(table, index, axis=1), self.scratch)
        pages = pages.at[:, page, positions % self.page_size].set(jnp.transpose(new, (1, 0, 2, 3)).astype(pages.dtype))
        return self._constrain(pages, self._page_sharding)

    def _run(self, params, pages, table, ids, starts, counts):
        """The model on ``ids`` [B, C] at positions ``starts + arange(C)`` over the paged past: (logits, pages
        with the ``counts`` real tokens' keys and values written)."""
        layout = self.layout
        b, c = ids.shape
        columns = jnp.arange(c, dtype=jnp.int32)[None]
        positions = starts[:, None] + columns
        views = tuple(self._view(p, table) for p in pages)
        window = jnp.arange(table.shape[1] * self.page_size, dtype=jnp.int32)[None]
        if layout.kind == "shared":
            # The chunk's padding counts as tokens: GroupQueryAttention puts the new tokens at
            # total - width, so they start at `starts`; causality keeps the real ones from seeing the pads.
            mask = window < (starts + c)[:, None]
        else:
            mask = jnp.concatenate([window < starts[:, None], jnp.ones((b, c), bool)], axis=1)
        named = {layout.input_ids: ids}
        if layout.attention_mask is not None:
            named[layout.attention_mask] = mask
        if layout.position_ids is not None:
            named[layout.position_ids] = positions
        logits, presents = self.source.forward(params, views, **named)
        valid = columns < counts[:, None]
        written = []
        for page, present in zip(pages, presents):
            if layout.kind == "shared":
                new = jax.vmap(lambda p, s: jax.lax.dynamic_slice_in_dim(p, s, c, axis=1))(present, starts)
            else:
                new = present[:, :, -c:]
            written.append(self._write(page, table, positions, valid, new))
        return logits, tuple(written)

    def _prefill_fn(self, params, pages, seen, table, starts, counts, ids, slots, rows):
        self.traces["prefill"] += 1
        self.widths.add(("prefill", table.shape[0], table.shape[1]))
        logits, pages = self._run(params, pages, table, ids, starts, counts)
        real = jnp.arange(self.chunk)[None] < counts[:, None]
        mine = jnp.minimum(slots, self.slots - 1)  # idle rows read some slot; their writes are dropped
        before = jnp.where((starts == 0)[:, None], False, seen[mine])
        onehot = jnp.zeros_like(before).at[jnp.arange(ids.shape[0])[:, None], ids].max(real)
        rows_seen = before | onehot
        seen = seen.at[slots].set(rows_seen, mode="drop")
        last = jnp.take_along_axis(logits, jnp.maximum(counts - 1, 0)[:, None, None], axis=1)[:, 0]
        return pages, seen, sampler.pick(last, rows_seen, rows)

    def _decode_fn(self, params, pages, seen, table, lengths, tokens, active, rows):
        self.traces["decode"] += 1
        self.widths.add(("decode", table.shape[0], table.shape[1]))
        logits, pages = self._run(params, pages, table, tokens[:, None], lengths, active.astype(jnp.int32))
        rows_in_use = tokens.shape[0]
        seen = seen.at[jnp.arange(rows_in_use), tokens].max(active)
        return pages, seen, sampler.pick(logits[:, -1], seen[:rows_in_use], rows)
