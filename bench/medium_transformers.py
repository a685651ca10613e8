"""Medium transformer exports (Llama-GQA, GPT-2, BERT) made with onnx.helper in the style of torch's dynamo exporter.

The issue's medium set: 6 layers, width 512, vocabulary 8,192, 8 heads of 64
(Llama: 2 key/value heads), about 100 MB each, too large to commit, so they
are built on demand, deterministic from a seed, and cached in ``bench/models/``
(git-ignored). Only onnx and numpy are needed.

The graphs copy what ``torch.onnx.export(dynamo=True)`` writes for the
transformers classes (compare tests/data/zoo/{mistral,gpt2,roberta}.onnx, node
for node): batch and sequence read with ``Shape``/``Squeeze``, reshape targets
built with ``Concat``, ``allowzero=1``; linear weights stored pre-transposed
([in, out]) for ``MatMul`` (GPT-2: ``Gemm`` on a flattened [-1, width] input,
its tied head a ``Transpose`` of the embedding); the padding-aware causal mask
of transformers' masking utilities (``CumSum`` over position ids, ``GatherND``
with broadcast index grids, ``LessOrEqual``, ``Where`` to 0 / float32 min);
Llama: RMSNorm decomposed (``Pow``, ``ReduceMean``, ``Sqrt``, ``Reciprocal``),
RoPE from ``Range``/``Cos``/``Sin`` with rotate-half ``Slice``/``Neg``/
``Concat``, grouped-query key/values repeated with ``Unsqueeze``/``Expand``/
``Reshape``, SiLU as ``x * Sigmoid(x)``; GPT-2: ``LayerNormalization``, fused
q|k|v ``Split``, tanh GELU decomposed; BERT (RoBERTa-style): position ids from a
``CumSum`` over non-padding tokens, token types via ``GatherElements``, the
padding mask through ``GatherND``, erf GELU decomposed, post-norm.

    python bench/medium_transformers.py               # builds (or finds) the three in bench/models/
    python bench/medium_transformers.py --width 64 --layers 2 --vocab 256 -o /tmp/tiny
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

KINDS = ("llama_gqa", "gpt2", "bert")
SHAPES = ((1, 128), (8, 256))  # batch x sequence of the medium benchmark
MODELS = pathlib.Path(__file__).resolve().parent / "models"
VERSION = 2  # of the graphs this script writes; part of the cached file's name, so a change rebuilds
_INT64_MAX = np.iinfo(np.int64).max
_FLOAT_MIN = np.finfo(np.float32).min


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes of a model; the defaults are the issue's medium set."""

    layers: int = 6
    width: int = 512
    heads: int = 8
    kv_heads: int = 2  # Llama only
    ffn: int = 2048  # GPT-2 and BERT; Llama uses llama_ffn
    llama_ffn: int = 1408
    vocab: int = 8192
    positions: int = 512  # learned position tables (GPT-2, BERT)

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def tag(self) -> str:
        return f"L{self.layers}-W{self.width}-H{self.heads}-KV{self.kv_heads}-V{self.vocab}"


MEDIUM = Config()
TINY = Config(layers=2, width=64, heads=4, kv_heads=2, ffn=128, llama_ffn=96, vocab=256, positions=64)


class _Graph:
    """Nodes and initializers of one graph, with deduplicated constants and fresh value names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._consts: dict[tuple, str] = {}
        self._nodes_by_key: dict[tuple, str | list[str]] = {}
        self._count = 0

    def _fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, value, dtype=np.int64) -> str:
        """An initializer holding ``value`` (a scalar or a list), shared by every use of the same value."""
        array = np.asarray(value, dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        if key not in self._consts:
            name = self._fresh("val")
            self.inits.append(numpy_helper.from_array(array, name))
            self._consts[key] = name
        return self._consts[key]

    def param(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array, np.float32), name))
        return name

    def linear(self, name: str, fan_in: int, fan_out: int, std: float = 0.02) -> str:
        """A linear layer's weight as the exporter stores it for MatMul: [in, out]."""
        return self.param(name, self.rng.standard_normal((fan_in, fan_out)) * std)

    def vector(self, name: str, size: int, center: float, std: float = 0.05) -> str:
        """A norm scale (center 1) or bias (center 0), perturbed so no two share a value."""
        return self.param(name, center + self.rng.standard_normal(size) * std)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs):
        """A node's output name(s); a node with the same op, inputs and attributes as an earlier one is not
        added again (the exporter's common-subexpression elimination: every layer reuses one reshape target)."""
        key = (op_type, inputs, outputs, tuple(sorted((k, str(v)) for k, v in attrs.items())))
        if key not in self._nodes_by_key:
            names = [self._fresh(op_type.lower()) for _ in range(outputs)]
            self.nodes.append(helper.make_node(op_type, list(inputs), names, name=f"node_{names[0]}", **attrs))
            self._nodes_by_key[key] = names[0] if outputs == 1 else names
        return self._nodes_by_key[key]


def _batch_and_seq(g: _Graph) -> tuple[str, str, str, str]:
    """``Shape``/``Squeeze`` of input_ids: [1]-shaped batch and sequence, and their scalars."""
    b1 = g.op("Shape", "input_ids", start=0, end=1)
    s1 = g.op("Shape", "input_ids", start=1, end=2)
    return b1, s1, g.op("Squeeze", b1), g.op("Squeeze", s1)


def _index_grid(g: _Graph, rows: str, cols: str) -> str:
    """The exporter's GatherND index for ``x[rows, cols]`` with broadcasting: [.., 2] int64."""
    shape = g.op("Shape", g.op("Max", rows, cols), start=0)
    last = g.const([-1])
    return g.op(
        "Concat",
        g.op("Unsqueeze", g.op("Expand", rows, shape), last),
        g.op("Unsqueeze", g.op("Expand", cols, shape), last),
        axis=-1,
    )


def _causal_mask(g: _Graph, b1: str, s1: str, b: str, s: str) -> tuple[str, str]:
    """transformers' causal mask with packed-sequence detection, as dynamo exports it: [B, 1, S, S] float.

    Returns the additive mask and the [1, S] position ids (``arange`` unsqueezed).
    """
    zero, one = g.const(0), g.const(1)
    arange = g.op("Range", zero, s, one)
    positions = g.op("Unsqueeze", arange, g.const([0]))
    expand = g.op("Expand", positions, g.op("Concat", b1, g.const([1]), axis=0))
    first = g.op("Slice", expand, g.const([0]), g.const([1]), g.const([1]), g.const([1]))
    cat = g.op("Concat", g.op("Sub", first, one), expand, axis=-1)
    previous = g.op("Slice", cat, g.const([0]), s1, g.const([-1]), g.const([1]))
    current = g.op("Slice", cat, g.const([1]), g.op("Reshape", g.op("Add", one, s), g.const([-1])), g.const([-1]),
                   g.const([1]))
    starts = g.op("Not", g.op("Equal", g.op("Sub", current, previous), one))
    packed = g.op("CumSum", g.op("Cast", starts, to=TensorProto.INT64), g.const(-1))
    batch = g.op("Unsqueeze", g.op("Unsqueeze", g.op("Range", zero, b, one), g.const([1, 2])), g.const([3]))
    seq = g.op("Unsqueeze", arange, g.const([0, 1]))
    query = g.op("Unsqueeze", seq, g.const([3]))
    key = g.op("Unsqueeze", seq, g.const([2]))
    at_query, at_key = _index_grid(g, batch, query), _index_grid(g, batch, key)
    same = g.op("And", g.const(True, np.bool_), g.op("Equal", g.op("GatherND", packed, at_query),
                                                     g.op("GatherND", packed, at_key)))
    causal = g.op("LessOrEqual", g.op("GatherND", expand, at_key), g.op("GatherND", expand, at_query))
    allowed = g.op("And", same, causal)
    return g.op("Where", allowed, g.const(0.0, np.float32), g.const(_FLOAT_MIN, np.float32)), positions


def _heads(g: _Graph, x: str, b1: str, s1: str, head_dim: int, perm=(0, 2, 1, 3)) -> str:
    shape = g.op("Concat", b1, s1, g.const([-1]), g.const([head_dim]), axis=0)
    return g.op("Transpose", g.op("Reshape", x, shape, allowzero=1), perm=list(perm))


def _attend(g: _Graph, q: str, k_t: str, v: str, mask: str, head_dim: int, b1: str, s1: str) -> str:
    """softmax(q k^T / sqrt(d) + mask) v, heads merged back to [B, S, width]."""
    scores = g.op("Mul", g.op("MatMul", q, k_t), g.const(1 / np.sqrt(head_dim), np.float32))
    probs = g.op("Softmax", g.op("Add", scores, mask), axis=-1)
    merged = g.op("Transpose", g.op("MatMul", probs, v), perm=[0, 2, 1, 3])
    return g.op("Reshape", merged, g.op("Concat", b1, s1, g.const([-1]), axis=0), allowzero=1)


def _rms_norm(g: _Graph, x: str, weight: str) -> str:
    mean = g.op("ReduceMean", g.op("Pow", x, g.const(2.0, np.float32)), g.const([-1]), keepdims=1,
                noop_with_empty_axes=0)
    rsqrt = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, g.const(1e-6, np.float32))))
    return g.op("Mul", weight, g.op("Mul", x, rsqrt))


def _rotate(g: _Graph, x: str, cos: str, sin: str, half: int) -> str:
    """x * cos + rotate_half(x) * sin, rotate_half by Slice/Neg/Concat on the last axis."""
    axis, step = g.const([3]), g.const([1])
    low = g.op("Slice", x, g.const([0]), g.const([half]), axis, step)
    high = g.op("Slice", x, g.const([half]), g.const([_INT64_MAX]), axis, step)
    rotated = g.op("Concat", g.op("Neg", high), low, axis=-1)
    return g.op("Add", g.op("Mul", x, cos), g.op("Mul", rotated, sin))


def _repeat_kv(g: _Graph, x: str, c: Config, b1: str, s1: str) -> str:
    """[B, kv, S, d] -> [B, heads, S, d] by Unsqueeze/Expand/Reshape (transformers' repeat_kv)."""
    d, rep = g.const([c.head_dim]), g.const([c.heads // c.kv_heads])
    target = g.op("Concat", b1, g.const([c.kv_heads]), rep, s1, d, axis=0)
    expanded = g.op("Expand", g.op("Unsqueeze", x, g.const([2])), target)
    return g.op("Reshape", expanded, g.op("Concat", b1, g.const([c.heads]), s1, d, axis=0), allowzero=1)


def _llama(g: _Graph, c: Config) -> tuple[list[str], list[tuple[str, list]]]:
    b1, s1, b, s = _batch_and_seq(g)
    x = g.op("Gather", g.param("embed_tokens", g.rng.standard_normal((c.vocab, c.width)) * 0.02), "input_ids", axis=0)
    mask, positions = _causal_mask(g, b1, s1, b, s)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, c.head_dim, 2) / c.head_dim))
    freqs = g.op("Mul", g.op("Cast", g.op("Unsqueeze", positions, g.const([2])), to=TensorProto.FLOAT),
                 g.param("rotary_emb.inv_freq", inv_freq))
    angles = g.op("Concat", freqs, freqs, axis=-1)
    cos = g.op("Unsqueeze", g.op("Cos", angles), g.const([1]))
    sin = g.op("Unsqueeze", g.op("Sin", angles), g.const([1]))
    kv_width = c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"layers.{i}."
        h = _rms_norm(g, x, g.vector(p + "input_layernorm", c.width, 1.0))
        q = _heads(g, g.op("MatMul", h, g.linear(p + "q_proj", c.width, c.width)), b1, s1, c.head_dim)
        k = _heads(g, g.op("MatMul", h, g.linear(p + "k_proj", c.width, kv_width)), b1, s1, c.head_dim)
        v = _heads(g, g.op("MatMul", h, g.linear(p + "v_proj", c.width, kv_width)), b1, s1, c.head_dim)
        q, k = _rotate(g, q, cos, sin, c.head_dim // 2), _rotate(g, k, cos, sin, c.head_dim // 2)
        k, v = _repeat_kv(g, k, c, b1, s1), _repeat_kv(g, v, c, b1, s1)
        attn = _attend(g, q, g.op("Transpose", k, perm=[0, 1, 3, 2]), v, mask, c.head_dim, b1, s1)
        x = g.op("Add", x, g.op("MatMul", attn, g.linear(p + "o_proj", c.width, c.width)))
        h = _rms_norm(g, x, g.vector(p + "post_attention_layernorm", c.width, 1.0))
        gate = g.op("MatMul", h, g.linear(p + "gate_proj", c.width, c.llama_ffn))
        up = g.op("MatMul", h, g.linear(p + "up_proj", c.width, c.llama_ffn))
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        x = g.op("Add", x, g.op("MatMul", act, g.linear(p + "down_proj", c.llama_ffn, c.width)))
    h = _rms_norm(g, x, g.vector("norm", c.width, 1.0))
    g.nodes.append(helper.make_node("MatMul", [h, g.linear("lm_head", c.width, c.vocab)], ["logits"]))
    return ["input_ids"], [("logits", ["batch", "seq", c.vocab])]


def _layer_norm(g: _Graph, x: str, name: str, width: int, epsilon: float) -> str:
    return g.op("LayerNormalization", x, g.vector(name + ".weight", width, 1.0), g.vector(name + ".bias", width, 0.0),
                axis=-1, epsilon=epsilon, stash_type=1)


def _gemm(g: _Graph, x: str, name: str, fan_in: int, fan_out: int, b1: str, s1: str) -> str:
    """GPT-2's Conv1D as exported: flatten to [-1, in], Gemm with [in, out] and a bias, back to [B, S, out]."""
    flat = g.op("Reshape", x, g.const([-1, fan_in]), allowzero=1)
    y = g.op("Gemm", flat, g.linear(name + ".weight", fan_in, fan_out), g.vector(name + ".bias", fan_out, 0.0, 0.02),
             alpha=1.0, beta=1.0, transA=0, transB=0)
    return g.op("Reshape", y, g.op("Concat", b1, s1, g.const([fan_out]), axis=0), allowzero=1)


def _gpt2(g: _Graph, c: Config) -> tuple[list[str], list[tuple[str, list]]]:
    b1, s1, b, s = _batch_and_seq(g)
    wte = g.param("wte", g.rng.standard_normal((c.vocab, c.width)) * 0.02)
    ids = g.op("Reshape", "input_ids", g.op("Concat", g.const([-1]), s1, axis=0), allowzero=1)
    mask, positions = _causal_mask(g, b1, s1, b, s)
    wpe = g.param("wpe", g.rng.standard_normal((c.positions, c.width)) * 0.01)
    x = g.op("Add", g.op("Gather", wte, ids, axis=0), g.op("Gather", wpe, positions, axis=0))
    for i in range(c.layers):
        p = f"h.{i}."
        qkv = _gemm(g, _layer_norm(g, x, p + "ln_1", c.width, 1e-5), p + "attn.c_attn", c.width, 3 * c.width, b1, s1)
        q, k, v = g.op("Split", qkv, axis=2, num_outputs=3, outputs=3)
        k_t = _heads(g, k, b1, s1, c.head_dim, perm=(0, 2, 3, 1))
        attn = _attend(g, _heads(g, q, b1, s1, c.head_dim), k_t, _heads(g, v, b1, s1, c.head_dim), mask,
                       c.head_dim, b1, s1)
        x = g.op("Add", _gemm(g, attn, p + "attn.c_proj", c.width, c.width, b1, s1), x)
        h = _gemm(g, _layer_norm(g, x, p + "ln_2", c.width, 1e-5), p + "mlp.c_fc", c.width, c.ffn, b1, s1)
        inner = g.op("Mul", g.op("Add", h, g.op("Mul", g.op("Pow", h, g.const(3.0, np.float32)),
                                                g.const(0.044715, np.float32))), g.const(0.7978845608, np.float32))
        gelu = g.op("Mul", g.op("Mul", h, g.const(0.5, np.float32)),
                    g.op("Add", g.op("Tanh", inner), g.const(1.0, np.float32)))
        x = g.op("Add", x, _gemm(g, gelu, p + "mlp.c_proj", c.ffn, c.width, b1, s1))
    h = _layer_norm(g, x, "ln_f", c.width, 1e-5)
    h = g.op("Reshape", h, g.op("Concat", g.const([-1]), s1, g.const([c.width]), axis=0), allowzero=1)
    g.nodes.append(helper.make_node("MatMul", [h, g.op("Transpose", wte, perm=[1, 0])], ["logits"]))
    return ["input_ids"], [("logits", ["batch", "seq", c.vocab])]


def _padding_mask(g: _Graph, b: str, s: str) -> str:
    """BERT's bidirectional padding mask as dynamo exports it: [B, 1, S, S] additive float."""
    zero, one = g.const(0), g.const(1)
    valid = g.op("Cast", "attention_mask", to=TensorProto.BOOL)
    batch = g.op("Unsqueeze", g.op("Unsqueeze", g.op("Range", zero, b, one), g.const([1, 2])), g.const([3]))
    seq = g.op("Unsqueeze", g.op("Range", zero, s, one), g.const([0, 1]))
    in_range = g.op("And", g.const(True, np.bool_), g.op("GreaterOrEqual", g.op("Unsqueeze", seq, g.const([3])), zero))
    allowed = g.op("And", in_range, g.op("GatherND", valid, _index_grid(g, batch, g.op("Unsqueeze", seq, g.const([2])))))
    return g.op("Where", allowed, g.const(0.0, np.float32), g.const(_FLOAT_MIN, np.float32))


def _bert(g: _Graph, c: Config) -> tuple[list[str], list[tuple[str, list]]]:
    b1, s1, b, s = _batch_and_seq(g)
    one = g.const(1)
    not_pad = g.op("Cast", g.op("Not", g.op("Equal", "input_ids", one)), to=TensorProto.INT32)
    counted = g.op("Cast", g.op("CumSum", g.op("Cast", not_pad, to=TensorProto.INT64), one), to=TensorProto.INT32)
    positions = g.op("Add", g.op("Cast", g.op("Mul", counted, not_pad), to=TensorProto.INT64), one)
    table = c.positions + 2
    types = g.op("Expand", g.const(np.zeros((1, table))), g.op("Concat", b1, g.const([1]), axis=0))
    type_ids = g.op("GatherElements", types, positions, axis=1)
    words = g.param("embeddings.word_embeddings", g.rng.standard_normal((c.vocab, c.width)) * 0.02)
    type_table = g.param("embeddings.token_type_embeddings", g.rng.standard_normal((1, c.width)) * 0.02)
    position_table = g.param("embeddings.position_embeddings", g.rng.standard_normal((table, c.width)) * 0.02)
    x = g.op("Add", g.op("Add", g.op("Gather", words, "input_ids", axis=0), g.op("Gather", type_table, type_ids, axis=0)),
             g.op("Gather", position_table, positions, axis=0))
    x = _layer_norm(g, x, "embeddings.LayerNorm", c.width, 1e-12)
    mask = _padding_mask(g, b, s)

    def dense(h: str, name: str, fan_in: int, fan_out: int) -> str:
        return g.op("Add", g.op("MatMul", h, g.linear(name + ".weight", fan_in, fan_out)),
                    g.vector(name + ".bias", fan_out, 0.0, 0.02))

    for i in range(c.layers):
        p = f"encoder.layer.{i}."
        q = _heads(g, dense(x, p + "attention.self.query", c.width, c.width), b1, s1, c.head_dim)
        k_t = _heads(g, dense(x, p + "attention.self.key", c.width, c.width), b1, s1, c.head_dim, perm=(0, 2, 3, 1))
        v = _heads(g, dense(x, p + "attention.self.value", c.width, c.width), b1, s1, c.head_dim)
        attn = _attend(g, q, k_t, v, mask, c.head_dim, b1, s1)
        x = _layer_norm(g, g.op("Add", dense(attn, p + "attention.output.dense", c.width, c.width), x),
                        p + "attention.output.LayerNorm", c.width, 1e-12)
        h = dense(x, p + "intermediate.dense", c.width, c.ffn)
        erf = g.op("Erf", g.op("Div", h, g.const(1.4142135, np.float32)))
        gelu = g.op("Mul", h, g.op("Mul", g.const(0.5, np.float32), g.op("Add", erf, g.const(1.0, np.float32))))
        x = _layer_norm(g, g.op("Add", dense(gelu, p + "output.dense", c.ffn, c.width), x),
                        p + "output.LayerNorm", c.width, 1e-12)
    g.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    return ["input_ids", "attention_mask"], [("last_hidden_state", ["batch", "seq", c.width])]


_BUILDERS = {"llama_gqa": _llama, "gpt2": _gpt2, "bert": _bert}


def build(kind: str, config: Config = MEDIUM, seed: int = 0) -> onnx.ModelProto:
    """The ``kind`` model (one of :data:`KINDS`) at ``config``, weights drawn from ``seed``; checked by onnx."""
    g = _Graph(seed)
    inputs, outputs = _BUILDERS[kind](g, config)
    graph = helper.make_graph(
        g.nodes,
        f"{kind}_{config.tag()}",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs],
        g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="bench/medium_transformers.py")
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model


def path_for(kind: str, config: Config = MEDIUM, seed: int = 0, folder: pathlib.Path | str = MODELS) -> pathlib.Path:
    """Where the cached ``kind`` model lives: one file per kind, config and seed."""
    return pathlib.Path(folder) / f"{kind}-{config.tag()}-s{seed}-v{VERSION}.onnx"


def ensure(kind: str, config: Config = MEDIUM, seed: int = 0, folder: pathlib.Path | str = MODELS) -> pathlib.Path:
    """The path of the ``kind`` model, built and saved first if the cache folder lacks it."""
    path = path_for(kind, config, seed, folder)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".onnx.tmp")
        onnx.save(build(kind, config, seed), tmp)
        tmp.replace(path)
    return path


def inputs(kind: str, batch: int, seq: int, config: Config = MEDIUM, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids in [2, vocab) (1 is BERT's padding id); BERT's mask pads the last quarter of every other row."""
    rng = np.random.default_rng(seed)
    values = {"input_ids": rng.integers(2, config.vocab, (batch, seq)).astype(np.int64)}
    if kind == "bert":
        mask = np.ones((batch, seq), np.int64)
        mask[1::2, seq - seq // 4:] = 0
        values["attention_mask"] = mask
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--layers", type=int, default=MEDIUM.layers)
    parser.add_argument("--width", type=int, default=MEDIUM.width)
    parser.add_argument("--vocab", type=int, default=MEDIUM.vocab)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--folder", default=str(MODELS))
    args = parser.parse_args()
    config = dataclasses.replace(MEDIUM, layers=args.layers, width=args.width, vocab=args.vocab)
    for kind in args.kinds.split(","):
        print(ensure(kind, config, args.seed, args.folder))


if __name__ == "__main__":
    main()
