"""onnxruntime's decoder attention ops that its model builder writes (com.microsoft): RotaryEmbedding and
GroupQueryAttention with its KV cache.

Semantics follow onnxruntime's CPU kernels (``onnxruntime/contrib_ops/cpu/bert``), checked node by node against
them in the tests. ONNX has no schemas for these ops, so the attribute defaults are the Python defaults below.

GroupQueryAttention, per batch row b with ``L = seqlens_k[b] + 1`` valid tokens in all (past + new) and
``S`` new tokens: the new tokens sit at positions ``past = max(L - S, 0)`` onwards (a first prompt, where
``total_sequence_length == S``, starts at 0 and its row may be right-padded: ``L < S``). Rotary positions are
``past + s``, or position_ids' (in a first prompt: its first element plus s, for every row, as onnxruntime
reads it). The new keys and values are written into the cache at rows ``[past, past + S)`` of that batch row;
query token s attends to cache rows ``j < L`` with ``j <= past + s`` (causal) and ``j > past + s -
local_window_size`` (a sliding window of local_window_size tokens, the query's own included). Scores are scaled,
softcapped, then attention_bias is added. The present cache is ``max(total_sequence_length, past capacity)``
long: a past of the full capacity is updated in place (onnxruntime's shared past/present buffer), a shorter past
is extended. Rows past a row's valid length are unspecified in onnxruntime; here they keep the past's values (or
zeros), are never read (not even as 0 x value: a NaN there stays there), and a right-padded prompt's padding
tokens attend to the row's valid keys.

``sliding_window_cache=1`` (the builder's ring cache for sliding-window layers): the past is a buffer of ``C >=
local_window_size = W`` positions holding only the most recent ones, at rows ``[0, end(P))`` for a row whose
past holds P positions, where ``end(P) = P`` while ``P <= C``, else ``P`` less the whole blocks of ``gap = C - W
+ 1`` rows reclaimed (onnxruntime's ``WindowedCacheEnd``: compacting once every ``gap`` steps). A step appends
its S new rows after the resident ones and attends over them (rotary positions stay absolute; the causal and
window masks depend only on distances), then keeps the ``end(P + S)`` most recent rows at the front of the
present (still ``C`` positions). Here that is one staging buffer of ``C + S + gap`` rows per step, exactly
onnxruntime's result on every row it defines (its staging and in-place paths alike).

**Paged caches** (the serving engine's, :mod:`onnx2jax.serving.runner`): inside :func:`paged_cache`, every
GroupQueryAttention takes its past as pages ``[pages, kv_heads, page_size, head_size]`` of a cache shared by
many requests, and the batch rows' block tables: row b's position i lives at offset ``i % page_size`` of page
``table[b, i // page_size]``. The op writes its S new keys and values straight into their pages (one scatter;
the tokens ``writable`` marks not, such as a chunk's padding, go to the scratch page nobody owns), then reads
each row's keys and values through its block table (one gather, in position order) and attends over them with
the mask of the unpaged op (row b holds ``seqlens_k[b] + 1`` tokens; causal; local window). The present is the
updated pages. A ring cache's layer (``sliding_window_cache=1``) reads its pages as a whole-sequence cache: a
ring that never wraps holds the same rows, and the window mask keeps its attention to the window.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
from onnx2jax.numerics import dot_precision


def rotate(x, cos, sin, *, interleaved: bool):
    """Rotary embedding of the first ``2 * cos.shape[-1]`` features of x's last axis; the rest pass through.

    ``cos``/``sin`` broadcast against x's leading axes with a last axis of rotary_dim / 2. Non-interleaved: the
    rotary part's halves are the real and imaginary parts; interleaved: even and odd features are.
    """
    half = cos.shape[-1]
    rot, rest = x[..., : 2 * half], x[..., 2 * half :]
    cos, sin = cos.astype(x.dtype), sin.astype(x.dtype)
    if interleaved:
        pairs = rot.reshape(*rot.shape[:-1], half, 2)
        real, imag = pairs[..., 0], pairs[..., 1]
        out = jnp.stack([real * cos - imag * sin, imag * cos + real * sin], axis=-1).reshape(rot.shape)
    else:
        real, imag = rot[..., :half], rot[..., half:]
        out = jnp.concatenate([real * cos - imag * sin, imag * cos + real * sin], axis=-1)
    return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


@register("RotaryEmbedding", 1, domain="com.microsoft")
def rotary_embedding(
    x, position_ids, cos_cache, sin_cache, *,
    interleaved: int = 0, is_packed_batching: int = 0, num_heads: int = 0, rotary_embedding_dim: int = 0,
    scale: float = 1.0,
):
    """Rotary embedding of ``x`` (B, S, hidden) or (B, N, S, head) at ``position_ids`` (B, S), or at
    ``position_ids[0] + s`` when position_ids has one element; the caches are (max_position, rotary_dim / 2)."""
    if is_packed_batching:
        raise NotImplementedError("RotaryEmbedding with is_packed_batching=1 is not implemented")
    if x.ndim == 4:
        b, _, s, head = x.shape
    else:
        b, s, hidden = x.shape
        head = hidden // num_heads if num_heads else 2 * cos_cache.shape[-1]
    rotary_dim = rotary_embedding_dim or head
    half = rotary_dim // 2
    if position_ids.size == 1:
        positions = jnp.broadcast_to(position_ids.reshape(()) + jnp.arange(s, dtype=position_ids.dtype), (b, s))
    else:
        positions = position_ids.reshape(b, s)
    cos = jnp.take(cos_cache[:, :half], positions, axis=0)  # (B, S, half)
    sin = jnp.take(sin_cache[:, :half], positions, axis=0)
    if x.ndim == 4:
        return rotate(x, cos[:, None], sin[:, None], interleaved=bool(interleaved))
    heads = x.reshape(b, s, hidden // head, head)
    return rotate(heads, cos[:, :, None], sin[:, :, None], interleaved=bool(interleaved)).reshape(x.shape)


def _present_length(total_sequence_length, past_key, new_length: int) -> int:
    """The present cache's length: max(total_sequence_length, past capacity), as onnxruntime sizes it.

    A traced total_sequence_length (a fixed-capacity decode loop feeds it as data) keeps the past's capacity:
    the cache is one buffer updated in place. Without a past the cache holds the new tokens.
    """
    capacity = 0 if past_key is None else past_key.shape[2]
    if isinstance(total_sequence_length, (np.ndarray, np.generic)):
        return max(int(np.asarray(total_sequence_length).reshape(())), capacity)
    return max(capacity, new_length)


def _write_cache(past, new, start, length: int):
    """past (B, H, C, D) (or None) extended to ``length`` rows, with new (B, H, S, D) written at rows start[b]."""
    b, h, s, d = new.shape
    if past is None:
        base = jnp.zeros((b, h, length, d), new.dtype)
    else:
        base = past.astype(new.dtype)
        if past.shape[2] < length:
            base = jnp.pad(base, ((0, 0), (0, 0), (0, length - past.shape[2]), (0, 0)))
    zero = jnp.zeros((), jnp.int32)
    write = jax.vmap(lambda cache, rows, at: jax.lax.dynamic_update_slice(cache, rows, (zero, at, zero)))
    return write(base, new, start.astype(jnp.int32))


def _rotary_positions(position_ids, total_sequence_length, b: int, s: int):
    """GroupQueryAttention's rotary positions from a position_ids input: per token, except in a first prompt
    (``total_sequence_length == S``), where onnxruntime reads the first element and counts on from it."""
    ids = position_ids.reshape(b, s).astype(jnp.int32)
    first = ids.reshape(-1)[0] + jnp.arange(s, dtype=jnp.int32)
    is_first_prompt = jnp.asarray(total_sequence_length).reshape(()) == s
    return jnp.where(is_first_prompt, jnp.broadcast_to(first, (b, s)), ids)


@dataclasses.dataclass(frozen=True)
class PagedCache:
    """The block tables of a paged call (module docstring): ``table`` [B, M] int32 (page indices; unused
    entries point at ``scratch``), ``writable`` [B, S] bool (which new tokens are written), ``scratch`` the page
    index nobody owns."""

    table: jax.Array
    writable: jax.Array
    scratch: int

    def update(self, pages, new, positions):
        """``pages`` [P, H, page, D] with ``new`` [B, H, S, D] written at ``positions`` [B, S]; and the rows'
        caches read through the block table, [B, H, M * page, D] in position order."""
        size = pages.shape[2]
        index = jnp.minimum(positions // size, self.table.shape[1] - 1)
        page = jnp.where(self.writable, jnp.take_along_axis(self.table, index, axis=1), self.scratch)
        pages = pages.at[page, :, positions % size].set(jnp.transpose(new, (0, 2, 1, 3)).astype(pages.dtype))
        b, m = self.table.shape
        rows = jnp.transpose(pages[self.table], (0, 2, 1, 3, 4))  # [B, H, M, page, D]
        return pages, rows.reshape(b, pages.shape[1], m * size, pages.shape[3])


_PAGED: contextvars.ContextVar[PagedCache | None] = contextvars.ContextVar("paged_cache", default=None)


@contextlib.contextmanager
def paged_cache(table, writable, scratch: int) -> Iterator[None]:
    """While tracing inside it, every GroupQueryAttention reads and writes its past as pages through ``table``
    (module docstring): ``table`` [B, M] int32, ``writable`` [B, S] bool, ``scratch`` the page nobody owns."""
    token = _PAGED.set(PagedCache(table, writable, scratch))
    try:
        yield
    finally:
        _PAGED.reset(token)


def _masked_softmax(scores, allowed, sink):
    """Softmax over the last axis of the allowed entries; a row with none allowed is all zeros. ``sink`` (a
    logit broadcastable to the rows, or None) joins each row's denominator without a column of its own."""
    neg = jnp.asarray(-jnp.inf, scores.dtype)
    m = jnp.max(jnp.where(allowed, scores, neg), axis=-1, keepdims=True)
    if sink is not None:
        m = jnp.maximum(m, sink)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.where(allowed, jnp.exp(scores - m), 0)
    denominator = jnp.sum(e, axis=-1, keepdims=True)
    if sink is not None:
        denominator = denominator + jnp.exp(sink - m)
    return e / jnp.where(denominator > 0, denominator, 1)


@register("GroupQueryAttention", 1, domain="com.microsoft")
def group_query_attention(
    query, key=None, value=None, past_key=None, past_value=None, seqlens_k=None, total_sequence_length=None,
    cos_cache=None, sin_cache=None, position_ids=None, attention_bias=None, head_sink=None, k_scale=None,
    v_scale=None, q_norm_weight=None, k_norm_weight=None, *,
    num_heads: int, kv_num_heads: int, causal: int = 1, do_rotary: int = 0, rotary_interleaved: int = 0,
    local_window_size: int = -1, scale: float = 0.0, softcap: float = 0.0, smooth_softmax: int = 0,
    qk_output: int = 0, sliding_window_cache: int = 0, mask_filter_value: float = -10000.0,
    k_quant_type: str = "NONE", v_quant_type: str = "NONE", kv_cache_bit_width: int = 0,
    qk_norm_epsilon: float = 1e-6,
):
    """Grouped-query attention with a KV cache: (output (B, S, N * D), present_key, present_value); see the
    module docstring for the positions, the cache update and the mask."""
    if k_scale is not None or v_scale is not None or k_quant_type != "NONE" or v_quant_type != "NONE":
        raise NotImplementedError("GroupQueryAttention with a quantized KV cache is not implemented")
    if q_norm_weight is not None or k_norm_weight is not None:
        raise NotImplementedError("GroupQueryAttention with q_norm_weight/k_norm_weight is not implemented")
    if qk_output:
        raise NotImplementedError("GroupQueryAttention's output_qk (qk_output != 0) is not implemented")
    if sliding_window_cache and (local_window_size <= 0 or past_key is None or attention_bias is not None):
        raise NotImplementedError(
            "GroupQueryAttention with sliding_window_cache=1 needs local_window_size > 0 and a past (as onnxruntime "
            "does), and is not implemented with attention_bias"
        )
    b, s, width = query.shape
    if key is None:
        head = width // (num_heads + 2 * kv_num_heads)
        # Gathers of constant columns rather than slices: under tensor parallelism the packed query is whole
        # on every device and q, k, v are wanted split by heads; XLA partitions a gather of a replicated
        # operand locally, while a slice is first cut evenly and its parts shifted (collective-permutes).
        q, k, v = (
            jnp.take(query, np.arange(lo, hi), axis=-1)
            for lo, hi in ((0, num_heads * head), (num_heads * head, (num_heads + kv_num_heads) * head),
                           ((num_heads + kv_num_heads) * head, width))
        )
    else:
        head = width // num_heads
        q, k, v = query, key, value

    def bnsh(x, heads):
        return jnp.transpose(x.reshape(b, s, heads, head), (0, 2, 1, 3))

    compute = jnp.float32 if query.dtype in (jnp.float16, jnp.bfloat16) else query.dtype
    q, k, v = bnsh(q, num_heads), bnsh(k, kv_num_heads), bnsh(v, kv_num_heads)
    valid = seqlens_k.astype(jnp.int32) + 1  # (B,) tokens in all, past and new
    start = jnp.maximum(valid - s, 0)  # (B,) where the new tokens begin
    positions = start[:, None] + jnp.arange(s, dtype=jnp.int32)[None]  # (B, S)
    if do_rotary:
        rotary_positions = positions
        if position_ids is not None:
            rotary_positions = _rotary_positions(position_ids, total_sequence_length, b, s)
        cos = jnp.take(cos_cache, rotary_positions, axis=0)[:, None]  # (B, 1, S, rotary_dim / 2)
        sin = jnp.take(sin_cache, rotary_positions, axis=0)[:, None]
        q = rotate(q, cos, sin, interleaved=bool(rotary_interleaved))
        k = rotate(k, cos, sin, interleaved=bool(rotary_interleaved))
    paged = _PAGED.get()
    if paged is not None:
        if past_key is None or past_value is None:
            raise ValueError("GroupQueryAttention over a paged cache needs past_key and past_value (the pages)")
        present_key, keys = paged.update(past_key, k, positions)
        present_value, values = paged.update(past_value, v, positions)
        column_positions = jnp.broadcast_to(jnp.arange(keys.shape[2], dtype=jnp.int32)[None], (b, keys.shape[2]))
        rows = valid
    elif sliding_window_cache:
        present_key, present_value, keys, values, column_positions, rows = _ring_step(
            past_key, past_value, k, v, start, valid, local_window_size
        )
    else:
        length = _present_length(total_sequence_length, past_key, s)
        present_key = keys = _write_cache(past_key, k, start, length)
        present_value = values = _write_cache(past_value, v, start, length)
        column_positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None], (b, length))
        rows = valid

    group = num_heads // kv_num_heads
    qg = q.astype(compute).reshape(b, kv_num_heads, group, s, head)
    scores = jnp.einsum("bkgsd,bktd->bkgst", qg, keys.astype(compute), precision=dot_precision(qg))
    scores = scores * jnp.asarray(scale if scale else 1 / np.sqrt(head), compute)
    if softcap > 0:
        scores = softcap * jnp.tanh(scores / softcap)
    length = keys.shape[2]
    if attention_bias is not None:
        bias = attention_bias.astype(compute)[..., :length]  # columns past total_sequence_length are masked
        bias = jnp.pad(bias, [(0, 0)] * (bias.ndim - 1) + [(0, length - bias.shape[-1])])
        scores = scores + jnp.broadcast_to(bias, (bias.shape[0], num_heads, s, bias.shape[-1])).reshape(
            bias.shape[0], kv_num_heads, group, s, bias.shape[-1]
        )
    column = column_positions[:, None, :]  # (B, 1, P): each cache row's position in the sequence
    readable = jnp.arange(length, dtype=jnp.int32)[None] < rows[:, None]  # (B, P): rows holding tokens
    allowed = readable[:, None, :] & jnp.ones((1, s, 1), bool)  # (B, S, P)
    if causal:
        allowed = allowed & (column <= positions[:, :, None])
    if local_window_size > 0:
        allowed = allowed & (column > positions[:, :, None] - local_window_size)
    sink = None
    if head_sink is not None:
        sink = head_sink.astype(compute).reshape(1, kv_num_heads, group, 1, 1)
    elif smooth_softmax:
        sink = jnp.zeros((), compute)
    probs = _masked_softmax(scores, allowed[:, None, None], sink)
    # rows past a row's tokens are never read: 0 x NaN would be NaN
    values = jnp.where(readable[:, None, :, None], values.astype(compute), jnp.zeros((), compute))
    out = jnp.einsum("bkgst,bktd->bkgsd", probs, values, precision=dot_precision(probs, values))
    out = jnp.transpose(out.reshape(b, num_heads, s, head), (0, 2, 1, 3)).reshape(b, s, num_heads * head)
    return out.astype(query.dtype), present_key, present_value


def _ring_end(past, capacity: int, gap: int):
    """onnxruntime's ``WindowedCacheEnd``: the resident rows of a ring of ``capacity`` after ``past`` positions."""
    overflow = jnp.maximum(past - capacity, 0)
    return past - gap * ((overflow + gap - 1) // gap)


def _ring_step(past_key, past_value, k, v, start, valid, window: int):
    """One step of a ring cache (module docstring): the new rows after the resident ones in a staging buffer.

    Returns (present_key, present_value, staging keys, staging values, each staging row's position in the
    sequence (B, rows), the staging rows holding tokens (B,)).
    """
    b, h, s, d = k.shape
    capacity = past_key.shape[2]
    gap = max(capacity - window + 1, 1)
    end_before = _ring_end(start, capacity, gap)  # resident rows before the step, new rows appended there
    end_after = _ring_end(valid, capacity, gap)  # resident rows after it
    offset = start - end_before  # staging row r holds position r + offset
    zero = jnp.zeros((), jnp.int32)

    def staged(past, new):
        base = jnp.pad(past.astype(new.dtype), ((0, 0), (0, 0), (0, s + gap), (0, 0)))
        write = jax.vmap(lambda c, rows, at: jax.lax.dynamic_update_slice(c, rows, (zero, at, zero)))
        return write(base, new, end_before.astype(jnp.int32))

    keys, values = staged(past_key, k), staged(past_value, v)
    shift = valid - end_after - offset  # the kept rows' first staging row
    keep = jax.vmap(lambda c, at: jax.lax.dynamic_slice(c, (zero, at, zero), (h, capacity, d)))
    present_key, present_value = keep(keys, shift), keep(values, shift)
    rows = keys.shape[2]
    positions = jnp.arange(rows, dtype=jnp.int32)[None] + offset[:, None]
    return present_key, present_value, keys, values, positions, valid - offset
