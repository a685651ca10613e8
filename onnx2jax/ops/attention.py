"""Fused transformer ops of recent opsets: Attention, RotaryEmbedding, LinearAttention, FlexAttention.

Attention follows ONNX's reference evaluator step by step (the order of the
scaling, softcap, bias and fully-masked-row rules decides float16 results).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx.helper

from onnx2jax.ops import _slices
from onnx2jax.ops.registry import register
from onnx2jax.ops.softmax import stable_softmax
from onnx2jax.numerics import dot_precision


def _split_heads(x, num_heads):
    """(batch, seq, heads * head) -> (batch, heads, seq, head)."""
    b, s, hidden = x.shape
    return jnp.transpose(x.reshape(b, s, num_heads, hidden // num_heads), (0, 2, 1, 3))


def _additive(mask, dtype):
    """A boolean mask (True = attend) -> 0 / -inf; a float mask is already additive."""
    if mask.dtype == jnp.bool_:
        return jnp.where(mask, jnp.zeros((), dtype), jnp.full((), -jnp.inf, dtype))
    return mask.astype(dtype)


def _band(q_len, kv_len, offset, allowed_fn, dtype):
    """0/-inf bias of shape (q, kv) (scalar offset) or (batch, 1, q, kv) (per-batch offset)."""
    i = jnp.arange(q_len).reshape(q_len, 1)
    j = jnp.arange(kv_len).reshape(1, kv_len)
    if isinstance(offset, int):
        allowed = allowed_fn(i + offset, j)
    else:
        allowed = allowed_fn(i[None] + offset.reshape(-1, 1, 1), j[None])[:, None]
    return jnp.where(allowed, jnp.zeros((), dtype), jnp.full((), -jnp.inf, dtype))


def _attention(
    q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, *, scale, is_causal, q_num_heads,
    kv_num_heads, softmax_precision, softcap, qk_matmul_output_mode, left_window_size=-1, right_window_size=-1,
):
    dtype = q.dtype
    rank3 = q.ndim == 3
    if rank3:
        q = _split_heads(q, q_num_heads)
        k = _split_heads(k, kv_num_heads)
        v = _split_heads(v, kv_num_heads)
    if scale is None:
        scale = 1 / np.sqrt(q.shape[3])
    # The reference scales Q and K by sqrt(scale) each, in the input dtype.
    root = jnp.asarray(np.sqrt(scale), dtype)
    if past_key is not None:
        k = jnp.concatenate([past_key, k], axis=2)
    if past_value is not None:
        v = jnp.concatenate([past_value, v], axis=2)
    present_key, present_value = k, v
    q_len, kv_len = q.shape[2], k.shape[2]

    if attn_mask is not None and attn_mask.shape[-1] < kv_len:
        fill = False if attn_mask.dtype == jnp.bool_ else -jnp.inf
        widths = [(0, 0)] * (attn_mask.ndim - 1) + [(0, kv_len - attn_mask.shape[-1])]
        attn_mask = jnp.pad(attn_mask, widths, constant_values=fill)

    if past_key is None and nonpad_kv_seqlen is not None:
        offset = nonpad_kv_seqlen.reshape(-1).astype(jnp.int64) - q_len
    else:
        offset = past_key.shape[2] if past_key is not None else 0
    bias = jnp.zeros((q_len, kv_len), dtype)
    if attn_mask is not None:
        bias = bias + _additive(attn_mask, dtype)
    if is_causal:
        bias = bias + _band(q_len, kv_len, offset, lambda i, j: j <= i, dtype)
    if left_window_size >= 0 or right_window_size >= 0:

        def window(i, j):
            allowed = jnp.ones(jnp.broadcast_shapes(i.shape, j.shape), bool)
            if left_window_size >= 0:
                allowed &= i - j <= left_window_size
            if right_window_size >= 0:
                allowed &= j - i <= right_window_size
            return allowed

        bias = bias + _band(q_len, kv_len, offset, window, dtype)
    if nonpad_kv_seqlen is not None:
        valid = jnp.arange(kv_len)[None, :] < nonpad_kv_seqlen.reshape(-1, 1)
        bias = bias + _additive(valid, dtype).reshape(-1, 1, 1, kv_len)

    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv and heads_q % heads_kv == 0:
        k = jnp.repeat(k, heads_q // heads_kv, axis=1)
        v = jnp.repeat(v, heads_q // heads_kv, axis=1)

    qk = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2), precision=dot_precision(q, k))
    raw_qk = qk
    if softcap and softcap > 0:
        cap = jnp.asarray(softcap, dtype)
        qk = jnp.tanh(qk / cap) * cap
    scores = qk + bias
    # Mode 0 is the plain Q K^T product (onnxruntime; ONNX's reference returns it
    # softcapped, and no node case tells them apart); mode 1 is after the softcap.
    qk_output = raw_qk if qk_matmul_output_mode == 0 else qk
    if qk_matmul_output_mode == 2:
        qk_output = scores
    if softmax_precision is not None:
        scores = scores.astype(onnx.helper.tensor_dtype_to_np_dtype(softmax_precision))
    # Softmax that maps a fully masked row (all -inf) to zeros instead of NaN.
    row_max = jnp.max(scores, axis=-1, keepdims=True)
    safe_max = jnp.where(jnp.isneginf(row_max), jnp.zeros_like(row_max), row_max)
    # Clamped at the max first so that XLA CPU cannot contract the subtraction into an FMA
    # over unrounded scores (see onnx2jax.ops.softmax.shifted_by_max).
    safe_max = jax.lax.stop_gradient(safe_max)
    e = jnp.exp(jnp.where(scores > safe_max, safe_max, scores) - safe_max)
    total = jnp.sum(e, axis=-1, keepdims=True)
    probs = e / jnp.where(total == 0, jnp.ones_like(total), total)
    masked_row = jnp.isneginf(jnp.max(bias, axis=-1, keepdims=True))
    probs = jnp.where(masked_row, jnp.zeros((), probs.dtype), probs)
    if qk_matmul_output_mode == 3:
        qk_output = probs
    y = jnp.matmul(probs.astype(dtype), v, precision=dot_precision(v))
    if rank3:
        y = jnp.transpose(y, (0, 2, 1, 3)).reshape(y.shape[0], y.shape[2], -1)
    return y.astype(dtype), present_key, present_value, qk_output.astype(dtype)


@register("Attention", 23, 24)  # 24 adds the optional nonpad_kv_seqlen input
def attention_24(
    q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal,
    qk_matmul_output_mode, softcap, scale=None, q_num_heads=None, kv_num_heads=None, softmax_precision=None,
):
    return _attention(
        q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, scale=scale, is_causal=is_causal,
        q_num_heads=q_num_heads, kv_num_heads=kv_num_heads, softmax_precision=softmax_precision,
        softcap=softcap, qk_matmul_output_mode=qk_matmul_output_mode,
    )


@register("Attention", 25)
def attention_25(
    q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *, is_causal,
    qk_matmul_output_mode, softcap, left_window_size, right_window_size, scale=None, q_num_heads=None,
    kv_num_heads=None, softmax_precision=None,
):
    if q.ndim == 4 and (q_num_heads is not None or kv_num_heads is not None):
        raise ValueError("Attention-25: q_num_heads and kv_num_heads must not be given for 4-D inputs")
    return _attention(
        q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, scale=scale, is_causal=is_causal,
        q_num_heads=q_num_heads, kv_num_heads=kv_num_heads, softmax_precision=softmax_precision,
        softcap=softcap, qk_matmul_output_mode=qk_matmul_output_mode,
        left_window_size=left_window_size, right_window_size=right_window_size,
    )


@register("RotaryEmbedding", 23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved, rotary_embedding_dim, num_heads=None):
    shape = x.shape
    if x.ndim == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        x = jnp.transpose(x, (0, 2, 1, 3))
    else:  # (batch, seq, heads * head)
        x = x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    dim = rotary_embedding_dim or x.shape[3]
    rotate, keep = x[..., :dim], x[..., dim:]
    if position_ids is not None:
        cos_cache = jnp.take(cos_cache, position_ids, axis=0)
        sin_cache = jnp.take(sin_cache, position_ids, axis=0)
    cos = cos_cache[:, :, None, :]
    sin = sin_cache[:, :, None, :]
    if interleaved:
        x1 = _slices.take(rotate, (slice(None),) * 3 + (slice(0, None, 2),))
        x2 = _slices.take(rotate, (slice(None),) * 3 + (slice(1, None, 2),))
    else:
        x1, x2 = rotate[..., : dim // 2], rotate[..., dim // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = jnp.stack([real, imag], axis=-1).reshape(rotate.shape)
    else:
        rotated = jnp.concatenate([real, imag], axis=-1)
    y = jnp.concatenate([rotated.astype(x.dtype), keep], axis=-1)
    if len(shape) == 4:
        return jnp.transpose(y, (0, 2, 1, 3))
    return y.reshape(shape)


@register("LinearAttention", 27)
def linear_attention(
    query, key, value, past_state=None, decay=None, beta=None, *, chunk_size, scale, update_rule,
    q_num_heads, kv_num_heads,
):
    # A recurrence over time (chunk_size is only a kernel tuning hint): per step
    #   gated:  S *= exp(g_t);   delta: v_t = beta_t * (v_t - S^T k_t)
    #   S += k_t v_t^T;          o_t = scale * q_t^T S (kv heads repeated for GQA).
    gating = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"LinearAttention: unknown update_rule {update_rule!r}")
    if gating and decay is None or delta and beta is None:
        raise ValueError(f"LinearAttention: update_rule {update_rule!r} needs decay/beta inputs")
    b, t, _ = query.shape
    d_k = query.shape[-1] // q_num_heads
    d_v = value.shape[-1] // kv_num_heads
    group = q_num_heads // kv_num_heads
    f32 = jnp.float32

    def steps(x, heads):  # (B, T, H*D) -> (T, B, H, D)
        return jnp.transpose(x.reshape(b, t, heads, -1), (1, 0, 2, 3)).astype(f32)

    xs = {"q": steps(query, q_num_heads), "k": steps(key, kv_num_heads), "v": steps(value, kv_num_heads)}
    if gating:
        xs["g"] = steps(decay, kv_num_heads)  # (T, B, H, 1) or (T, B, H, d_k)
    if delta:
        xs["beta"] = steps(beta, beta.shape[-1])  # (T, B, H or 1, 1)
    if past_state is not None:
        state, state_dtype = past_state.astype(f32), past_state.dtype
    else:
        state, state_dtype = jnp.zeros((b, kv_num_heads, d_k, d_v), f32), query.dtype
    scale_value = 1.0 / np.sqrt(d_k) if not scale else float(scale)

    def step(s, x):
        if gating:
            s = s * jnp.exp(x["g"])[..., None]
        v = x["v"]
        if delta:
            retrieved = jnp.einsum("bhdm,bhd->bhm", s, x["k"], precision=dot_precision(s, x["k"]))
            v = x["beta"] * (v - retrieved)
        s = s + x["k"][..., :, None] * v[..., None, :]
        read = jnp.repeat(s, group, axis=1) if group > 1 else s
        out = scale_value * jnp.einsum("bhd,bhdm->bhm", x["q"], read, precision=dot_precision(x["q"], read))
        return s, out

    state, outs = jax.lax.scan(step, state, xs)  # outs (T, B, Hq, d_v)
    output = jnp.transpose(outs, (1, 0, 2, 3)).reshape(b, t, q_num_heads * d_v)
    return output.astype(query.dtype), state.astype(state_dtype)


def _softmax_dtype(dtype, softmax_precision):
    if softmax_precision is not None:
        return onnx.helper.tensor_dtype_to_np_dtype(softmax_precision)
    return jnp.float64 if dtype == jnp.float64 else jnp.float32


@register("FlexAttention", 1, domain="ai.onnx.preview", context=True)
def flex_attention(ctx, q, k, v, *, scale=None, score_mod=None, prob_mod=None, softmax_precision=None):
    # Scores = (Q K^T) * scale -> score_mod -> softmax -> prob_mod -> @ V, with the
    # modifier subgraphs run on tensors of the softmax precision.
    heads_q, heads_kv = q.shape[1], k.shape[1]
    if heads_q != heads_kv:
        k = jnp.repeat(k, heads_q // heads_kv, axis=1)
        v = jnp.repeat(v, heads_q // heads_kv, axis=1)
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[3])
    root = jnp.asarray(np.sqrt(np.float32(scale)), q.dtype)
    scores = jnp.matmul(q * root, jnp.swapaxes(k * root, -1, -2), precision=dot_precision(q, k))
    compute = _softmax_dtype(q.dtype, softmax_precision)
    scores = scores.astype(compute)
    if score_mod is not None:
        (scores,) = ctx.run_graph(score_mod, [scores])
        scores = jnp.asarray(scores).astype(compute)
    probs = stable_softmax(scores, axis=-1)
    if prob_mod is not None:
        (probs,) = ctx.run_graph(prob_mod, [probs])
        probs = jnp.asarray(probs).astype(compute)
    return jnp.matmul(probs, v.astype(compute), precision=dot_precision(probs)).astype(v.dtype)
