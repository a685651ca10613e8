"""Channel-parallel pairs of convolutions: the Megatron pattern on a CNN's conv blocks.

A *column* Conv (``group == 1``, weight ``W[M, C, *k]`` an initializer) splits
its output channels M; the channels stay split through per-channel ops
(activations, BatchNormalization, pooling, a bias or scale by a constant, a
grouped or depthwise Conv whose groups the split keeps whole); a *row* Conv
(``group == 1``) reads them split on its input channels C, a reduction, so its
output is written replicated: the pair's one all-reduce (`sharding.rules.conv`).

The walk back from a row's input accepts only single-activation ops and
requires that nothing else reads the split tensors: a column whose output
also feeds a residual ``Add`` or a second reader would need its whole output
gathered there, which costs more than the all-reduce it saves (the plan
counts it and leaves that conv whole, with a note). Pairs are taken in graph
order, each conv in one pair at most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from sharding.megatron.graph import PlanGraph
from sharding.megatron.specs import Assignment, replicated_spec, split_spec

# Ops that keep a channel split on their one activation input (NCHW, channel axis 1).
_PER_CHANNEL = frozenset(
    """Relu LeakyRelu PRelu Elu Selu Celu Gelu Sigmoid HardSigmoid HardSwish Mish Softplus Softsign Tanh
    Clip Identity Dropout BatchNormalization MaxPool AveragePool LpPool Add Sub Mul Div""".split()
)


@dataclass(frozen=True)
class ConvPair:
    """A column Conv, the grouped convs on the way, and the row Conv that reads its channels."""

    column: str
    row: str
    ways: int
    between: tuple[str, ...]
    all_reduce_elements: int | None  # the row output's elements per batch item, when known


def _conv_weight(graph: PlanGraph, node: onnx.NodeProto) -> tuple[int, ...] | None:
    if node.op_type != "Conv" or len(node.input) < 2 or node.input[1] not in graph.inits:
        return None
    shape = graph.inits[node.input[1]]
    return shape if len(shape) >= 3 else None


def _only_activation(graph: PlanGraph, node: onnx.NodeProto) -> str | None:
    """The node's one non-constant input (its activation), or None when it has several."""
    live = [name for name in node.input if name and name not in graph.constants]
    if node.op_type == "Conv":
        live = node.input[:1]
    return live[0] if len(live) == 1 else None


def _walk_to_column(graph: PlanGraph, row: onnx.NodeProto) -> tuple[int, list[int]] | None:
    """From a row Conv's input back to the Conv that produces it, through per-channel ops only.

    Returns (column index, indices of the nodes between), or None when the
    path meets anything else, or a tensor on it has another reader.
    """
    tensor, between = row.input[0], []
    while True:
        if len(graph.consumers.get(tensor, [])) != 1 or tensor not in graph.producer:
            return None
        index = graph.producer[tensor]
        node = graph.nodes[index]
        weight = _conv_weight(graph, node)
        if weight is not None and int(graph.attr(node, "group", 1)) == 1:
            return index, between
        grouped = weight is not None and int(graph.attr(node, "group", 1)) > 1
        if not grouped and node.op_type not in _PER_CHANNEL:
            return None
        source = _only_activation(graph, node)
        if source is None or node.output[0] != tensor:
            return None
        between.append(index)
        tensor = source


def _elements(graph: PlanGraph, tensor: str) -> int | None:
    shape = graph.shapes.get(tensor)
    if not shape or any(not isinstance(d, int) for d in shape[1:]):
        return None
    return math.prod(shape[1:])


def conv_pairs(graph: PlanGraph, n: int, notes: list[str]) -> list[ConvPair]:
    """Column/row Conv pairs and how many ways each splits (see the module docstring)."""
    pairs: list[ConvPair] = []
    taken: set[int] = set()
    for index, node in enumerate(graph.nodes):
        weight = _conv_weight(graph, node)
        if weight is None or int(graph.attr(node, "group", 1)) != 1:
            continue
        found = _walk_to_column(graph, node)
        if found is None:
            continue
        column, between = found
        if column in taken or index in taken:
            continue
        ways = math.gcd(weight[1], n)
        for b in between:
            groups = int(graph.attr(graph.nodes[b], "group", 1))
            if graph.nodes[b].op_type == "Conv":
                ways = math.gcd(ways, groups)
        if ways == 1:
            notes.append(f"{graph.nodes[column].name} -> {node.name}: {weight[1]} channels; "
                         f"no split of {n} devices keeps whole groups; left whole")
            continue
        taken |= {column, index}
        pairs.append(ConvPair(graph.nodes[column].name, node.name, ways,
                              tuple(graph.nodes[b].name for b in reversed(between)),
                              _elements(graph, node.output[0])))
    paired = {name for p in pairs for name in (p.column, p.row)}
    for node in graph.nodes:
        if _conv_weight(graph, node) is not None and node.name not in paired and (
            int(graph.attr(node, "group", 1)) == 1 and not any(node.name in p.between for p in pairs)
        ):
            notes.append(f"{node.name}: conv with no row partner; splitting its output channels "
                         f"would all-gather its whole output at {_channel_gather(graph, node)}: left whole")
    return pairs


def _channel_gather(graph: PlanGraph, conv: onnx.NodeProto) -> str:
    """Where a channel split of ``conv``'s output would be gathered, in words."""
    tensor = conv.output[0]
    while True:
        readers = [graph.nodes[i] for i in graph.consumers.get(tensor, [])]
        if not readers:
            return "the graph output"
        if len(readers) > 1:
            return f"its {len(readers)} readers ({', '.join(r.name for r in readers)})"
        (node,) = readers
        weight = _conv_weight(graph, node)
        if weight is not None and int(graph.attr(node, "group", 1)) == 1:
            return f"{node.name} (a row would be its partner, but it is paired elsewhere)"
        if node.op_type not in _PER_CHANNEL and weight is None:
            return f"{node.name} ({node.op_type} needs the channels whole)"
        if _only_activation(graph, node) is None:
            return f"{node.name} ({node.op_type} meets a whole tensor: a residual)"
        tensor = node.output[0]


def conv_pair_assignments(graph: PlanGraph, pair: ConvPair, n: int, index: int) -> list[Assignment]:
    """Column: W and bias on output channels, Y on channels; grouped convs between: W/bias by
    groups; row: X and W on input channels, bias and Y replicated (the pair's all-reduce)."""
    by_name = {node.name: node for node in graph.nodes}
    role = f"C{index} conv"
    w = pair.ways
    out: list[Assignment] = []
    column = by_name[pair.column]
    out.append(Assignment(column.name, replicated_spec(column.input[0], n), f"{role} column"))
    out.append(Assignment(column.name, split_spec(column.input[1], 0, w, n), f"{role} column"))
    if len(column.input) > 2 and column.input[2]:
        out.append(Assignment(column.name, split_spec(column.input[2], 0, w, n), f"{role} column"))
    out.append(Assignment(column.name, split_spec(column.output[0], 1, w, n), f"{role} column"))
    for name in pair.between:
        node = by_name[name]
        if node.op_type == "Conv":  # grouped: whole groups per device
            out.append(Assignment(name, split_spec(node.input[1], 0, w, n), f"{role} grouped"))
            if len(node.input) > 2 and node.input[2]:
                out.append(Assignment(name, split_spec(node.input[2], 0, w, n), f"{role} grouped"))
    row = by_name[pair.row]
    out.append(Assignment(row.name, split_spec(row.input[0], 1, w, n), f"{role} row"))
    out.append(Assignment(row.name, split_spec(row.input[1], 1, w, n), f"{role} row"))
    if len(row.input) > 2 and row.input[2]:
        out.append(Assignment(row.name, replicated_spec(row.input[2], n), f"{role} row"))
    out.append(Assignment(row.name, replicated_spec(row.output[0], n), f"{role} row"))
    return out
