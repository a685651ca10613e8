"""Minimal annotated graphs, one per cause of issue 10, with symbolic batch and sequence.

Each builder returns ``(model, inputs, minimum)``: the annotated model, inputs
at one concrete shape, and the analytic minimum of collectives (by HLO kind).
Only the weight MatMuls carry specs (column-parallel: weight split on its
output axis, output split on its last axis; row-parallel: weight split on
axis 0, output replicated); everything in between is left to inference.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sharding.annotate import add_configuration, set_spec
from sharding.spec import ShardingSpec
from sharding.text import parse_spec

N = 8  # devices
HEADS, HEAD_DIM = 8, 2
EMBED = HEADS * HEAD_DIM
DEVICES = tuple(range(N))
RNG = np.random.default_rng(0)


def _split(name: str, axis: int, ways: int = N) -> ShardingSpec:
    return ShardingSpec.split(name, {axis: ways}, DEVICES)


def _rep(name: str) -> ShardingSpec:
    return ShardingSpec.replicated(name, DEVICES)


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array((RNG.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


class _Builder:
    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.specs: list[tuple[str, ShardingSpec]] = []

    def node(self, op: str, inputs: list[str], output: str | list[str], **attrs) -> str:
        outputs = [output] if isinstance(output, str) else output
        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"n{len(self.nodes)}_{op}", **attrs))
        return output

    def column(self, x: str, weight: str, out: str) -> str:
        """x @ W with W split on its output axis, out split on its last axis (rank 3)."""
        self.node("MatMul", [x, weight], out)
        name = self.nodes[-1].name
        self.specs += [(name, _rep(x)), (name, _split(weight, 1)), (name, _split(out, 2))]
        return out

    def row(self, x: str, weight: str, out: str) -> str:
        """x @ W with W split on axis 0, out replicated."""
        self.node("MatMul", [x, weight], out)
        name = self.nodes[-1].name
        self.specs += [(name, _split(weight, 0)), (name, _rep(out))]
        return out

    def model(self, inputs, outputs) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 10
        add_configuration(model, "tp", N)
        for node, spec in self.specs:
            set_spec(model, node, spec, "tp")
        return model


def _x(name="x", last=EMBED):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", last])


def _y(name="y", last=EMBED):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["B", "S", last])


def _heads_to_batch(b: _Builder, t: str, prefix: str) -> str:
    """[B,S,E] -> [B*H, S, D] the way eager attention exports it (symbolic target shape)."""
    b.node("Reshape", [t, "heads_shape"], f"{prefix}4")
    b.node("Transpose", [f"{prefix}4"], f"{prefix}t", perm=[0, 2, 1, 3])
    b.node("Shape", [f"{prefix}t"], f"{prefix}shape", start=2)
    b.node("Concat", ["minus_one", f"{prefix}shape"], f"{prefix}target", axis=0)
    return b.node("Reshape", [f"{prefix}t", f"{prefix}target"], f"{prefix}3")


def _batch_to_heads(b: _Builder, t: str) -> str:
    """[B*H, S, D] -> [B, S, E] (symbolic target shape)."""
    b.node("Shape", ["x"], "batch", start=0, end=1)
    b.node("Concat", ["batch", "heads_rest"], "back_target", axis=0)
    b.node("Reshape", [t, "back_target"], "back4")
    b.node("Transpose", ["back4"], "backt", perm=[0, 2, 1, 3])
    return b.node("Reshape", ["backt", "merge_shape"], "merged")


def _attention_inits(b: _Builder):
    b.inits += [
        _ints("heads_shape", [0, 0, HEADS, HEAD_DIM]),
        _ints("minus_one", [-1]),
        _ints("heads_rest", [HEADS, -1, HEAD_DIM]),
        _ints("merge_shape", [0, 0, EMBED]),
    ]


def inputs_for(model: onnx.ModelProto, batch: int = 2, seq: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    out = {}
    for info in model.graph.input:
        sizes = {"B": batch, "S": seq, "BH": batch * HEADS, "P": 3, "T": seq + 3}
        dims = [sizes.get(d.dim_param, d.dim_value) for d in info.type.tensor_type.shape.dim]
        out[info.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def heads_into_batch() -> onnx.ModelProto:
    """Cause 1: [B,H,S,D] -> [B*H,S,D] with symbolic B and S, elementwise there, and back.

    Minimum: the row-parallel MatMul's all-reduce.
    """
    b = _Builder()
    b.inits += [_weight("wq", EMBED, EMBED), _weight("wo", EMBED, EMBED)]
    _attention_inits(b)
    q = _heads_to_batch(b, b.column("x", "wq", "q"), "q")
    b.node("Relu", [q], "act")
    b.row(_batch_to_heads(b, "act"), "wo", "y")
    return b.model([_x()], [_y()])


def attention_core(manual_softmax: bool = False, past: bool = False) -> onnx.ModelProto:
    """Cause 2: Q·Kᵀ on the fused batch×heads axis, scaled by a traced scalar, plus a mask
    [1, 1, S] that broadcasts and an ALiBi bias [B*H, 1, S] given replicated, softmax (or
    its max/exp/sum/divide by hand), ·V; with ``past``, keys and values are concatenated
    after a replicated cache along the sequence.

    Minimum: the row-parallel MatMul's all-reduce.
    """
    b = _Builder()
    b.inits += [_weight(n, EMBED, EMBED) for n in ("wq", "wk", "wv", "wo")]
    b.inits += [numpy_helper.from_array(np.float32(0.5).reshape(()), "half")]
    _attention_inits(b)
    q = _heads_to_batch(b, b.column("x", "wq", "q"), "q")
    k = _heads_to_batch(b, b.column("x", "wk", "k"), "k")
    v = _heads_to_batch(b, b.column("x", "wv", "v"), "v")
    if past:  # a key/value cache [B*H, P, D] given replicated, concatenated along the sequence
        b.node("Concat", ["past_k", k], "k_all", axis=1)
        b.node("Concat", ["past_v", v], "v_all", axis=1)
        k, v = "k_all", "v_all"
    b.node("Transpose", [k], "k_t", perm=[0, 2, 1])
    b.node("MatMul", [q, "k_t"], "scores")
    # a scale computed at run time: a traced scalar
    b.node("ReduceMax", ["x"], "xmax", keepdims=0)
    b.node("Mul", ["xmax", "half"], "scale0")
    b.node("Sigmoid", ["scale0"], "scale")
    b.node("Mul", ["scores", "scale"], "scaled")
    b.node("Add", ["scaled", "bias"], "masked")
    b.node("Add", ["masked", "alibi"], "biased")
    if manual_softmax:  # max, subtract, exp, sum, divide: reductions along the last axis
        b.inits.append(_ints("last", [-1]))
        b.node("ReduceMax", ["biased", "last"], "top", keepdims=1)
        b.node("Sub", ["biased", "top"], "shifted")
        b.node("Exp", ["shifted"], "e")
        b.node("ReduceSum", ["e", "last"], "total", keepdims=1)
        b.node("Div", ["e", "total"], "probs")
    else:
        b.node("Softmax", ["biased"], "probs", axis=-1)
    b.node("MatMul", ["probs", v], "ctx")
    b.row(_batch_to_heads(b, "ctx"), "wo", "y")
    total = "T" if past else "S"
    alibi = helper.make_tensor_value_info("alibi", TensorProto.FLOAT, ["BH", 1, total])
    bias = helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, total])
    caches = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["BH", "P", HEAD_DIM]) for n in ("past_k", "past_v")]
    return b.model([_x(), bias, alibi] + (caches if past else []), [_y()])


def shared_bias() -> onnx.ModelProto:
    """Cause 3: one zero bias used by a column-parallel Linear and by a LayerNorm.

    Minimum: the row-parallel MatMul's all-reduce (no gather of the constant).
    """
    b = _Builder()
    b.inits += [_weight("w1", EMBED, EMBED), _weight("w2", EMBED, EMBED)]
    b.inits += [numpy_helper.from_array(np.zeros(EMBED, np.float32), "zero"),
                numpy_helper.from_array(np.ones(EMBED, np.float32), "one")]
    h = b.column("x", "w1", "h")
    b.node("Add", [h, "zero"], "hb")
    name = b.nodes[-1].name
    b.specs += [(name, _split("zero", 0)), (name, _split("hb", 2))]
    b.node("Relu", ["hb"], "act")
    b.row("act", "w2", "r")
    b.node("LayerNormalization", ["r", "one", "zero"], "norm", axis=-1)
    b.node("Add", ["norm", "zero"], "y")
    return b.model([_x()], [_y()])


def qkv_split(widths: tuple[int, ...]) -> onnx.ModelProto:
    """Cause 5: one column-parallel projection cut into q|k|v by a Split of ``widths``.

    Each piece goes through its own row-parallel MatMul and the results are
    added. Minimum with pieces that hold whole shards of the projection: the
    row-parallel all-reduce; otherwise one all-gather of the projection first.
    """
    b = _Builder()
    total = sum(widths)
    b.inits += [_weight("wqkv", EMBED, total), _ints("widths", list(widths))]
    names = [f"part{i}" for i in range(len(widths))]
    b.node("Split", [b.column("x", "wqkv", "qkv"), "widths"], names, axis=-1)
    outs = []
    for i, (name, width) in enumerate(zip(names, widths)):
        b.inits.append(_weight(f"wo{i}", width, EMBED))
        b.node("MatMul", [name, f"wo{i}"], f"o{i}")
        outs.append(f"o{i}")
    b.node("Sum", outs, "y")
    return b.model([_x()], [_y()])


def qkv_slices(widths: tuple[int, ...]) -> onnx.ModelProto:
    """Cause 5: like `qkv_split`, with one Slice per piece (how GQA exports q|k|v of unequal widths)."""
    b = _Builder()
    total = sum(widths)
    b.inits += [_weight("wqkv", EMBED, total), _ints("axes", [-1])]
    qkv = b.column("x", "wqkv", "qkv")
    outs, start = [], 0
    for i, width in enumerate(widths):
        b.inits += [_ints(f"s{i}", [start]), _ints(f"e{i}", [start + width]), _weight(f"wo{i}", width, EMBED)]
        b.node("Slice", [qkv, f"s{i}", f"e{i}", "axes"], f"part{i}")
        b.node("MatMul", [f"part{i}", f"wo{i}"], f"o{i}")
        outs.append(f"o{i}")
        start += width
    b.node("Sum", outs, "y")
    return b.model([_x()], [_y()])


def fused_spec_on_symbolic_axis(text: str) -> onnx.ModelProto:
    """Cause 7: `heads_into_batch` with the Relu's input written as the fused spec ``text``
    (``0:(?x1,8x8)``: [B*H] = (B, 1 shard) x (H, 8 shards), B symbolic)."""
    b = _Builder()
    b.inits += [_weight("wq", EMBED, EMBED), _weight("wo", EMBED, EMBED)]
    _attention_inits(b)
    q = _heads_to_batch(b, b.column("x", "wq", "q"), "q")
    b.node("Relu", [q], "act")
    b.specs.append((b.nodes[-1].name, parse_spec(f"{text} @ [{','.join(map(str, DEVICES))}]", q)))
    b.row(_batch_to_heads(b, "act"), "wo", "y")
    return b.model([_x()], [_y()])


def fused_qkv_slices(cut: str = "Slice") -> onnx.ModelProto:
    """Cause 5, block-aligned: a q|k|v projection written with the fused spec
    ``(3 x 1 shard, 16 x 8 shards)`` on its output axis, cut into q, k, v by Slices (or one
    Split) at sub-axis boundaries, combined elementwise (q * k + v) and projected by a
    row-parallel Linear. Every device holds its block of each piece: the cut is local, and
    the minimum is the row-parallel all-reduce."""
    b = _Builder()
    width = EMBED
    b.inits += [_weight("wqkv", EMBED, 3 * width), _ints("axes", [-1])]
    b.node("MatMul", ["x", "wqkv"], "qkv")
    name = b.nodes[-1].name
    fused = f"1:(3x1,{width}x{N}) @ [{','.join(map(str, DEVICES))}]"
    b.specs += [(name, _rep("x")), (name, parse_spec(fused, "wqkv")), (name, parse_spec(fused.replace("1:", "2:"), "qkv"))]
    names = [f"part{i}" for i in range(3)]
    if cut == "Split":
        b.node("Split", ["qkv"], names, axis=-1, num_outputs=3)
    for i in range(3):
        if cut == "Slice":
            b.inits += [_ints(f"s{i}", [i * width]), _ints(f"e{i}", [(i + 1) * width])]
            b.node("Slice", ["qkv", f"s{i}", f"e{i}", "axes"], names[i])
    b.node("Mul", names[:2], "qk")
    b.node("Add", ["qk", names[2]], "mixed")
    b.inits.append(_weight("wo", width, EMBED))
    b.row("mixed", "wo", "y")
    return b.model([_x()], [_y()])


def view_op(op: str, extra_inputs: list[tuple[str, list[int]]] = (), **attrs) -> onnx.ModelProto:
    """[B,S,E] -> column Linear -> [B*H, S, D] (heads fused into the batch) -> ``op`` -> graph output.

    ``extra_inputs`` are int64 constants the op reads after the tensor (Slice bounds, axes).
    The output has no spec, so it comes back replicated: one all-gather, and none before it
    while the op runs on the unfused view.
    """
    b = _Builder()
    b.inits += [_weight("wq", EMBED, EMBED)]
    _attention_inits(b)
    q = _heads_to_batch(b, b.column("x", "wq", "q"), "q")
    for name, values in extra_inputs:
        b.inits.append(_ints(name, values))
    b.node(op, [q, *(n for n, _ in extra_inputs)], "y", **attrs)
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return b.model([_x()], [out])


def parallel_residual(blocks: int = 2) -> onnx.ModelProto:
    """GPT-NeoX's block shape without attention: x + mlp_a(ln_a(x)) + mlp_b(ln_b(x)), ``blocks`` times.

    Each branch is a column-parallel MatMul, ReLU, a row-parallel MatMul with a
    bias. Minimum: forward one all-reduce per block (the branches' partial
    sums added first), backward one per block (x's gradient from both
    LayerNorms, and their scale and bias gradients, reduced together).
    """
    b = _Builder()
    x = "x"
    for k in range(blocks):
        branches = []
        for side in "ab":
            p = f"{side}{k}"
            b.inits += [_weight(f"w_{p}_up", EMBED, 2 * EMBED), _weight(f"w_{p}_down", 2 * EMBED, EMBED)]
            b.inits += [numpy_helper.from_array((1 + 0.1 * RNG.standard_normal(EMBED)).astype(np.float32), f"g_{p}"),
                        numpy_helper.from_array((0.1 * RNG.standard_normal(EMBED)).astype(np.float32), f"b_{p}"),
                        numpy_helper.from_array((0.1 * RNG.standard_normal(EMBED)).astype(np.float32), f"bias_{p}")]
            b.node("LayerNormalization", [x, f"g_{p}", f"b_{p}"], f"ln_{p}", axis=-1)
            b.column(f"ln_{p}", f"w_{p}_up", f"up_{p}")
            b.node("Relu", [f"up_{p}"], f"act_{p}")
            b.row(f"act_{p}", f"w_{p}_down", f"down_{p}")
            branches.append(b.node("Add", [f"down_{p}", f"bias_{p}"], f"out_{p}"))
        b.node("Add", branches, f"branches{k}")
        x = b.node("Add", [f"branches{k}", x], f"x{k + 1}" if k + 1 < blocks else "y")
    return b.model([_x()], [_y()])


def gemm_gate_up() -> onnx.ModelProto:
    """A gated MLP on flattened tokens [T, D] as Gemms with transB: gate and up read x * scale, down is row-parallel.

    Minimum: forward one all-reduce (down), backward one (the gradient of
    scale, from gate's and up's partial input gradients together).
    """
    b = _Builder()
    b.inits += [_weight("w_gate", 2 * EMBED, EMBED), _weight("w_up", 2 * EMBED, EMBED), _weight("w_down", EMBED, 2 * EMBED)]
    b.inits += [numpy_helper.from_array((1 + 0.1 * RNG.standard_normal(EMBED)).astype(np.float32), "scale")]
    b.node("Mul", ["x", "scale"], "xs")
    for weight, out in (("w_gate", "gate"), ("w_up", "up")):
        b.node("Gemm", ["xs", weight], out, transB=1)
        name = b.nodes[-1].name
        b.specs += [(name, _rep("xs")), (name, _split(weight, 0)), (name, _split(out, 1))]
    b.node("Sigmoid", ["gate"], "sig")
    b.node("Mul", ["gate", "sig"], "silu")
    b.node("Mul", ["silu", "up"], "h")
    b.node("Gemm", ["h", "w_down"], "y", transB=1)
    name = b.nodes[-1].name
    b.specs += [(name, _split("w_down", 1)), (name, _rep("y"))]
    flat = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, ["T", EMBED])  # noqa: E731
    return b.model([flat("x")], [flat("y")])
