"""A hand-written flax NNX Llama (GQA, RoPE, RMSNorm, SiLU-gated MLP) with the weights of a medium_transformers export.

The reference for onnx2jax's compute: the same model written the way a JAX
user would write it (einsums on [batch, seq, heads, head_dim], grouped-query
attention by reshaping the query heads into key/value groups instead of
repeating keys and values, a causal mask from ``jnp.tril``), its parameters
read from the initializers of ``bench/medium_transformers.py``'s ``llama_gqa``
model so both compute the same function.

    model = FlaxLlama.from_onnx(onnx.load(path), config)
    forward, state = jitted(model)      # split once, jax.jit of merge + call
    logits = forward(state, input_ids)
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from flax import nnx
from onnx import numpy_helper

from medium_transformers import Config

_EPS = 1e-6


class RMSNorm(nnx.Module):
    def __init__(self, scale: np.ndarray) -> None:
        self.scale = nnx.Param(jnp.asarray(scale))

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.scale[...] * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + _EPS))


class Block(nnx.Module):
    """One decoder layer; linear weights are [in, out] as the export stores them."""

    def __init__(self, weights: dict[str, np.ndarray], prefix: str, config: Config) -> None:
        self.config = config
        self.input_norm = RMSNorm(weights[prefix + "input_layernorm"])
        self.post_norm = RMSNorm(weights[prefix + "post_attention_layernorm"])
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            setattr(self, name, nnx.Param(jnp.asarray(weights[prefix + name])))

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array, mask: jax.Array) -> jax.Array:
        c = self.config
        b, s, _ = x.shape
        groups = c.heads // c.kv_heads
        h = self.input_norm(x)
        q = (h @ self.q_proj[...]).reshape(b, s, c.kv_heads, groups, c.head_dim)
        k = (h @ self.k_proj[...]).reshape(b, s, c.kv_heads, c.head_dim)
        v = (h @ self.v_proj[...]).reshape(b, s, c.kv_heads, c.head_dim)
        q = _rope(q, cos[:, :, None, None], sin[:, :, None, None])
        k = _rope(k, cos[:, :, None], sin[:, :, None])
        scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k) * (c.head_dim ** -0.5)
        probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(scores.dtype).min), axis=-1)
        attn = jnp.einsum("bkgqs,bskd->bqkgd", probs, v).reshape(b, s, c.width)
        x = x + attn @ self.o_proj[...]
        h = self.post_norm(x)
        return x + (jax.nn.silu(h @ self.gate_proj[...]) * (h @ self.up_proj[...])) @ self.down_proj[...]


def _rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


class FlaxLlama(nnx.Module):
    """input_ids [batch, seq] -> logits [batch, seq, vocab]."""

    def __init__(self, weights: dict[str, np.ndarray], config: Config) -> None:
        self.config = config
        self.embed = nnx.Param(jnp.asarray(weights["embed_tokens"]))
        self.inv_freq = nnx.Variable(jnp.asarray(weights["rotary_emb.inv_freq"]))
        self.layers = nnx.List([Block(weights, f"layers.{i}.", config) for i in range(config.layers)])
        self.norm = RMSNorm(weights["norm"])
        self.lm_head = nnx.Param(jnp.asarray(weights["lm_head"]))

    @classmethod
    def from_onnx(cls, model: onnx.ModelProto, config: Config) -> FlaxLlama:
        """The model with the export's initializers (by their module names) as parameters."""
        return cls({t.name: numpy_helper.to_array(t) for t in model.graph.initializer}, config)

    def __call__(self, input_ids: jax.Array) -> jax.Array:
        s = input_ids.shape[1]
        x = jnp.take(self.embed[...], input_ids, axis=0)
        angles = jnp.arange(s, dtype=jnp.float32)[:, None] * self.inv_freq[...][None, :]
        angles = jnp.concatenate([angles, angles], axis=-1)[None]  # [1, S, head_dim]
        cos, sin = jnp.cos(angles), jnp.sin(angles)
        mask = jnp.tril(jnp.ones((s, s), bool))
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x) @ self.lm_head[...]


def jitted(model: FlaxLlama) -> tuple[Callable, nnx.State]:
    """``(forward, state)``: ``forward(state, input_ids)`` is jax.jit of merge + call, the state split once.

    Splitting once keeps flax's graph traversal out of the per-call path (nnx.jit
    redoes it at every call); the state goes in as jit arguments, as onnx2jax
    passes its parameters. ``forward.lower(state, ids)`` gives the HLO.
    """
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, input_ids):
        return nnx.merge(graphdef, state)(input_ids)

    return forward, state
