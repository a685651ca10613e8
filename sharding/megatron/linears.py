"""The linears of the Megatron plan: MatMul/Gemm nodes with a 2-D weight, and how they pair.

A *linear* is a MatMul or Gemm whose weight is a 2-D initializer, directly or
through a 2-D Transpose, with its bias (Gemm's C, or the Add of a 1-D
initializer right after a MatMul) and the cut of its output's feature axis
(`sharding.megatron.parts`). `find_linears` finds them all; `pair_linears`
reads the column/row pairs off the graph: a linear whose activation descends
from other linears (through anything but a normalisation) is a row, those
linears its columns.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import onnx

from sharding.op_facts import LINEAR_PRODUCTS
from sharding.megatron.builder import PackedAttention, packed_attention, quantized_weight
from sharding.megatron.graph import PlanGraph
from sharding.megatron.parts import Part, feature_parts

@dataclass(frozen=True)
class Linear:
    """A MatMul/Gemm with a 2-D initializer weight.

    Attributes:
        node: The MatMul/Gemm node's name.
        op_type: ``"MatMul"`` or ``"Gemm"``.
        activation: Its activation input (A).
        weight: Its weight input (B), as the node reads it.
        parameter: The initializer behind the weight (the weight itself, or
            the input of the 2-D Transpose producing it).
        transpose: The Transpose node's name when the weight goes through one.
        k_axis: The weight's contraction axis (in ``weight``).
        activation_k_axis: The activation's contraction axis.
        in_features: K.
        out_features: N.
        bias: ``(node, tensor)`` of the bias: Gemm's C, or the Add of a 1-D
            initializer right after a MatMul; None when there is none.
        matmul_output: The MatMul/Gemm node's own output.
        output: The linear's output after its bias (``matmul_output`` when
            the bias is Gemm's C or there is none).
        parts: k when the output is split into k equal parts on the feature
            axis (fused q/k/v or gate/up), else 1.
        heads: Attention heads per part, read from the Reshape that splits
            the feature axis; None when no such Reshape follows.
        uneven: The output is split on the feature axis into unequal (or
            unknown) parts; such a linear is left replicated, and its parts
            (when known) are split by their readers.
        pieces: The parts of an unequal cut, in feature order.
        blocks: For a MatMulNBits, the quantisation blocks along K (a row split cuts whole blocks);
            0 for a float weight.
        quant: For a MatMulNBits, ``(name, shape)`` of its ``scales`` and ``zero_points`` inputs (those
            given).
        attention: The GroupQueryAttention this linear feeds a packed q|k|v, or None.
    """

    node: str
    op_type: str
    activation: str
    weight: str
    parameter: str
    transpose: str | None
    k_axis: int
    activation_k_axis: int
    in_features: int
    out_features: int
    bias: tuple[str, str] | None
    matmul_output: str
    output: str
    parts: int = 1
    heads: int | None = None
    uneven: bool = False
    pieces: tuple[Part, ...] = ()
    blocks: int = 0
    quant: tuple[tuple[str, tuple[int, ...]], ...] = ()
    attention: PackedAttention | None = None

    @property
    def units(self) -> int:
        """What a shard must hold whole: heads when known, else features per part."""
        return self.heads if self.heads is not None else self.out_features // self.parts




def _weight_of(graph: PlanGraph, node: onnx.NodeProto) -> tuple[str, str | None] | None:
    """``(parameter, transpose node)`` when input B is a 2-D initializer, possibly transposed."""
    if len(node.input) < 2:
        return None
    weight = node.input[1]
    if len(graph.inits.get(weight, ())) == 2:
        return weight, None
    index = graph.producer.get(weight)
    if index is None:
        return None
    producer = graph.nodes[index]
    if producer.op_type != "Transpose" or len(graph.inits.get(producer.input[0], ())) != 2:
        return None
    if list(graph.attr(producer, "perm", [1, 0])) != [1, 0]:
        return None
    return producer.input[0], producer.name


def _quantized_linear(graph: PlanGraph, node: onnx.NodeProto) -> Linear:
    """A MatMulNBits as a linear: N is B's axis 0, K its blocks axis 1; bias is input 5."""
    k, n = int(graph.attr(node, "K")), int(graph.attr(node, "N"))
    names = list(node.input) + [""] * 6
    bias = (node.name, names[5]) if names[5] else None
    return Linear(
        node=node.name, op_type=node.op_type, activation=node.input[0], weight=node.input[1],
        parameter=node.input[1], transpose=None, k_axis=1, activation_k_axis=-1, in_features=k,
        out_features=n, bias=bias, matmul_output=node.output[0], output=node.output[0],
        blocks=graph.inits[node.input[1]][1],
        quant=tuple((t, tuple(graph.shapes.get(t, ()))) for t in names[2:4] if t),
    )


def _find_linear(graph: PlanGraph, index: int) -> Linear | None:
    node = graph.nodes[index]
    if quantized_weight(graph, node):
        lin = _quantized_linear(graph, node)
        bias, output = _bias_after(graph, lin.output, lin.out_features, lin.bias)
        return dataclasses.replace(lin, bias=bias, output=output)
    if node.op_type not in LINEAR_PRODUCTS:
        return None
    found = _weight_of(graph, node)
    if found is None:
        return None
    parameter, transpose = found
    param_shape = graph.inits[parameter]
    weight_shape = param_shape[::-1] if transpose else param_shape
    bias = None
    if node.op_type == "Gemm":
        trans_b = graph.attr(node, "transB", 0)
        k_axis = 1 if trans_b else 0
        act_k = 0 if graph.attr(node, "transA", 0) else 1
        if len(node.input) > 2 and node.input[2]:
            bias = (node.name, node.input[2])
    else:
        k_axis, act_k = 0, -1
    in_features = weight_shape[k_axis]
    out_features = weight_shape[1 - k_axis]
    bias, output = _bias_after(graph, node.output[0], out_features, bias)
    return Linear(
        node=node.name,
        op_type=node.op_type,
        activation=node.input[0],
        weight=node.input[1],
        parameter=parameter,
        transpose=transpose,
        k_axis=k_axis,
        activation_k_axis=act_k,
        in_features=in_features,
        out_features=out_features,
        bias=bias,
        matmul_output=node.output[0],
        output=output,
    )


def _bias_after(
    graph: PlanGraph, output: str, out_features: int, bias: tuple[str, str] | None
) -> tuple[tuple[str, str] | None, str]:
    """``(bias, output)``: the Add of a 1-D initializer of size N right after ``output`` and its output,
    when there is no bias yet; else ``bias`` and ``output`` unchanged."""
    if bias is None:
        consumers = graph.consumers.get(output, [])
        if len(consumers) == 1:
            add = graph.nodes[consumers[0]]
            other = [i for i in add.input if i != output]
            if add.op_type == "Add" and len(other) == 1 and graph.inits.get(other[0]) == (out_features,):
                return (add.name, other[0]), add.output[0]
    return bias, output


def find_linears(graph: PlanGraph) -> dict[int, Linear]:
    """Every linear of the graph by node index, in graph order, with the cut of its feature axis."""
    linears: dict[int, Linear] = {}
    for index in range(len(graph.nodes)):
        lin = _find_linear(graph, index)
        if lin is None:
            continue
        packed = packed_attention(graph, lin.output)
        if packed is not None:  # q|k|v for GroupQueryAttention: equal parts only when H == KV
            equal = packed.heads == packed.kv_heads
            linears[index] = dataclasses.replace(
                lin, attention=packed, parts=3 if equal else 1, heads=packed.heads, uneven=not equal
            )
            continue
        cut = feature_parts(graph, lin.output, lin.out_features)
        if cut.parts == 0:
            linears[index] = dataclasses.replace(lin, uneven=True, pieces=cut.pieces)
            continue
        linears[index] = dataclasses.replace(lin, parts=cut.parts, heads=cut.heads)
    return linears


def pair_linears(
    graph: PlanGraph, linears: dict[int, Linear], notes: list[str]
) -> tuple[dict[int, str], list[tuple[list[int], int, bool]]]:
    """The role (``"row"``/``"column"``) of each paired linear, and the pairs as
    ``(column indices, row index, crossed attention)`` in graph order.

    A linear fed by a row without a normalisation between stays unpaired (a note says so).
    """
    role: dict[int, str] = {}
    raw_pairs: list[tuple[list[int], int, bool]] = []
    for index, lin in linears.items():
        sources, attention = graph.walk_back(lin.activation, set(linears))
        if not sources:
            continue
        rows = sorted(s for s in sources if role.get(s) == "row")
        if rows:
            notes.append(
                f"{lin.node}: fed by row-parallel {[linears[s].node for s in rows]} "
                "without a normalisation between; left replicated"
            )
            continue
        role[index] = "row"
        for source in sources:
            role[source] = "column"
        raw_pairs.append((sorted(sources), index, attention))
    return role, raw_pairs
