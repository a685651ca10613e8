"""Graph partitions: node -> part, the tensors that cross parts, each part as its own model.

One routine serves pipeline stages (`sharding.stages`) and, later, the
segments around data-dependent nodes (DESIGN, "Data-dependent shapes"): a
partition maps every node of the main graph to an integer part; parts run in
increasing order, so a data edge from a later part to an earlier one is an
error.

*Shape-only* tensors are the exception. Their values follow from graph input
shapes and constants alone (``Shape(input_ids)``, the ``Range`` and masks
built from it, RoPE's cos/sin tables): a part that reads one recomputes it
from its own copy of the producing nodes instead of receiving it, so such
tensors never cross and never make a backward edge. For a transformer the
only tensor that then crosses between layers is the residual stream.

Framework-neutral: onnx and numpy only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from sharding.op_facts import NONDETERMINISTIC, SHAPE_READERS
from sharding.shapes import infer_model, node_inputs, subgraphs, topological_order


class BackwardEdgeError(ValueError):
    """A data edge goes from a later part to an earlier one.

    Attributes:
        edges: ``(tensor, producer node, producer part, consumer node, consumer part)``.
    """

    def __init__(self, edges: Sequence[tuple[str, str, int, str, int]], what: str = "stage"):
        self.edges = tuple(edges)
        lines = [
            f"  {tensor!r}: {producer} ({what} {p}) -> {consumer} ({what} {c})"
            for tensor, producer, p, consumer, c in self.edges
        ]
        super().__init__(
            f"{len(self.edges)} data edge(s) go from a later {what} back to an earlier one "
            f"({what}s run in increasing order):\n" + "\n".join(lines)
        )


@dataclass(frozen=True)
class GraphIndex:
    """Producers and consumers of the main graph's tensors, by node index.

    Attributes:
        nodes: The main graph's nodes, in graph order.
        producer: tensor -> index of the node that produces it.
        consumers: tensor -> indices of the nodes that read it, in order.
        constants: initializer names.
        inputs: runtime graph inputs (not initializers).
        outputs: graph output names.
    """

    nodes: tuple[onnx.NodeProto, ...]
    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[int, ...]]
    constants: frozenset[str]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> GraphIndex:
        producer: dict[str, int] = {}
        consumers: dict[str, list[int]] = {}
        for index, node in enumerate(graph.node):
            for name in node.output:
                if name:
                    producer[name] = index
            for name in node_inputs(node):
                consumers.setdefault(name, []).append(index)
        constants = frozenset(i.name for i in graph.initializer)
        return cls(
            nodes=tuple(graph.node),
            producer=producer,
            consumers={k: tuple(v) for k, v in consumers.items()},
            constants=constants,
            inputs=tuple(i.name for i in graph.input if i.name not in constants),
            outputs=tuple(o.name for o in graph.output),
        )

    def topological_order(self) -> list[int]:
        """Node indices in a topological order, graph order among ready nodes.

        Raises:
            ValueError: The graph has a cycle or reads a tensor nothing defines.
        """
        return topological_order(self.nodes)

    def shape_only(self) -> set[str]:
        """Tensors whose values follow from graph input shapes and constants alone.

        Initializers; outputs of Shape/Size reading a graph input or another
        shape-only tensor; outputs of any other deterministic node without
        subgraphs whose inputs are all shape-only (a Constant has none).
        """
        result = set(self.constants)
        for index in self.topological_order():
            node = self.nodes[index]
            if node.op_type in NONDETERMINISTIC or any(True for _ in subgraphs(node)):
                continue
            names = node_inputs(node)
            if node.op_type in SHAPE_READERS:
                ok = bool(names) and (names[0] in result or names[0] in self.inputs)
            else:
                ok = all(n in result for n in names)
            if ok:
                result.update(n for n in node.output if n)
        return result


@dataclass(frozen=True)
class Partition:
    """A main graph cut into parts that run in increasing part order.

    Attributes:
        part_of: node name -> part.
        parts: the part ids, increasing.
        nodes: part -> its node names, in graph order.
        crossing: ``(tensor, from part, to part)`` for each data tensor one
            part produces and a later part reads (shape-only tensors are
            recomputed, not sent).
        recomputed: part -> names of nodes of other parts it recomputes.
        inputs: part -> tensors it receives: graph inputs and crossing
            tensors, in a stable order.
        outputs: part -> tensors it produces that later parts or the graph's
            outputs read.
    """

    part_of: Mapping[str, int]
    parts: tuple[int, ...]
    nodes: Mapping[int, tuple[str, ...]]
    crossing: tuple[tuple[str, int, int], ...]
    recomputed: Mapping[int, tuple[str, ...]]
    inputs: Mapping[int, tuple[str, ...]]
    outputs: Mapping[int, tuple[str, ...]]


def duplicate_names(graph: onnx.GraphProto) -> list[str]:
    """Node names used more than once, or '' if some node has no name."""
    seen: dict[str, int] = {}
    for node in graph.node:
        seen[node.name] = seen.get(node.name, 0) + 1
    return sorted(name for name, count in seen.items() if count > 1 or not name)


def require_unique_names(graph: onnx.GraphProto) -> None:
    """Raises ValueError listing every duplicate node name (and unnamed nodes), at once."""
    bad = duplicate_names(graph)
    if bad:
        unnamed = sum(1 for n in graph.node if not n.name)
        parts = [repr(b) for b in bad if b]
        text = ", ".join(parts)
        if unnamed:
            text += ("; and " if text else "") + f"{unnamed} unnamed node(s)"
        raise ValueError(
            f"node names must be unique to assign stages: duplicates {text} "
            "(`onnx2jax annotate --name-nodes` names them)"
        )


def partition(graph: onnx.GraphProto, part_of: Mapping[str, int], what: str = "stage") -> Partition:
    """Checks a node -> part assignment and finds what crosses between parts.

    Args:
        graph: The main graph; node names must be unique.
        part_of: A part (>= 0) for every node. Shape-only nodes may be left
            out: they join the earliest part that reads them.
        what: The name of a part in error messages ("stage", "segment").

    Returns:
        The `Partition`.

    Raises:
        ValueError: duplicate names, a negative part, or nodes without a part.
        BackwardEdgeError: data edges from a later part to an earlier one.
    """
    require_unique_names(graph)
    index = GraphIndex.of(graph)
    names = [n.name for n in index.nodes]
    negative = sorted((n, p) for n, p in part_of.items() if p < 0)
    if negative:
        raise ValueError(f"negative {what}s: " + ", ".join(f"{n}={p}" for n, p in negative))
    unknown = sorted(set(part_of) - set(names))
    if unknown:
        raise ValueError(f"{what}s name nodes that are not in the graph: {unknown[:10]}")
    shape_only = index.shape_only()
    assigned = dict(part_of)
    order = index.topological_order()
    for i in reversed(order):  # unassigned shape-only nodes join their earliest reader
        node = index.nodes[i]
        if node.name in assigned:
            continue
        if not all(o in shape_only for o in node.output if o):
            continue
        readers = [assigned.get(index.nodes[c].name) for o in node.output for c in index.consumers.get(o, ())]
        readers = [r for r in readers if r is not None]
        assigned[node.name] = min(readers) if readers else max(part_of.values(), default=0)
    missing = [n for n in names if n not in assigned]
    if missing:
        raise ValueError(
            f"{len(missing)} node(s) have no {what}: {missing[:10]}"
            + (" ..." if len(missing) > 10 else "")
        )
    backward = []
    crossing: dict[tuple[str, int], int] = {}
    for node in index.nodes:
        to_part = assigned[node.name]
        for name in node_inputs(node):
            if name not in index.producer or name in shape_only:
                continue
            producer = index.nodes[index.producer[name]]
            from_part = assigned[producer.name]
            if from_part > to_part:
                backward.append((name, producer.name, from_part, node.name, to_part))
            elif from_part < to_part:
                crossing[(name, to_part)] = from_part
    if backward:
        raise BackwardEdgeError(backward, what)
    parts = tuple(sorted(set(assigned.values())))
    nodes = {p: tuple(n for n in names if assigned[n] == p) for p in parts}
    recomputed = {p: _recomputed(index, assigned, shape_only, p) for p in parts}
    inputs, outputs = {}, {}
    for p in parts:
        members = set(nodes[p]) | set(recomputed[p])
        reads = []
        for node in index.nodes:
            if node.name in members:
                reads += [n for n in node_inputs(node) if n not in reads]
        produced = {o for node in index.nodes if node.name in members for o in node.output}
        inputs[p] = tuple(
            n for n in reads if n not in produced and n not in index.constants and (n in index.inputs or n in index.producer)
        )
        outputs[p] = tuple(
            o
            for node in index.nodes
            if assigned[node.name] == p
            for o in node.output
            if o and (o in index.outputs or any(t == o and q > p for (t, q) in crossing))
        )
    return Partition(
        part_of=assigned,
        parts=parts,
        nodes=nodes,
        crossing=tuple(sorted(((t, f, q) for (t, q), f in crossing.items()), key=lambda e: (e[2], e[0]))),
        recomputed=recomputed,
        inputs=inputs,
        outputs=outputs,
    )


def _recomputed(index: GraphIndex, assigned: Mapping[str, int], shape_only: set[str], part: int) -> tuple[str, ...]:
    """Nodes of other parts that ``part`` needs to recompute the shape-only tensors it reads."""
    needed: set[int] = set()
    frontier = [
        name
        for node in index.nodes
        if assigned[node.name] == part
        for name in node_inputs(node)
        if name in shape_only and name in index.producer
    ]
    while frontier:
        name = frontier.pop()
        producer = index.producer.get(name)
        if producer is None or producer in needed or assigned[index.nodes[producer].name] == part:
            continue
        needed.add(producer)
        frontier += [n for n in node_inputs(index.nodes[producer]) if n in index.producer]
    return tuple(index.nodes[i].name for i in sorted(needed))


def extract_part(
    model: onnx.ModelProto, part: Partition, which: int, types: Mapping[str, onnx.ValueInfoProto] | None = None
) -> onnx.ModelProto:
    """One part as a standalone model: its nodes and recomputed nodes, inputs and outputs.

    The part's inputs (graph inputs and crossing tensors) become graph inputs
    typed from the whole model's shape inference; initializers are copied only
    if read (external-data references are kept as they are). Node annotations
    are kept; the caller adapts them to the part's devices.

    Args:
        types: ``sharding.shapes.infer_model(model).value_types(model)``, when
            the caller has it (one inference for every part).
    """
    members = set(part.nodes[which]) | set(part.recomputed[which])
    graph = model.graph
    if types is None:
        types = infer_model(model).value_types(model)
    sub = onnx.GraphProto(name=f"{graph.name or 'graph'}_{which}")
    sub.node.extend(copy.deepcopy(n) for n in graph.node if n.name in members)
    read = {n for node in sub.node for n in node_inputs(node)}
    sub.initializer.extend(copy.deepcopy(i) for i in graph.initializer if i.name in read)
    sub.sparse_initializer.extend(copy.deepcopy(s) for s in graph.sparse_initializer if s.values.name in read)
    for name in part.inputs[which]:
        sub.input.append(copy.deepcopy(types[name]) if name in types else onnx.ValueInfoProto(name=name))
    for name in part.outputs[which]:
        sub.output.append(copy.deepcopy(types[name]) if name in types else onnx.ValueInfoProto(name=name))
    produced = {o for n in sub.node for o in n.output}
    sub.value_info.extend(copy.deepcopy(v) for v in graph.value_info if v.name in produced)
    result = _without_graph(model)
    result.graph.CopyFrom(sub)
    return result


def _is_repeated(field) -> bool:
    """Whether a protobuf field descriptor is repeated (``is_repeated`` in newer protobuf, ``label`` in older)."""
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return field.label == field.LABEL_REPEATED


def _without_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of every field of ``model`` but its graph (whose weights may be large)."""
    result = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name == "graph":
            continue
        if _is_repeated(field):
            getattr(result, field.name).extend(value)
        elif field.message_type is not None:
            getattr(result, field.name).CopyFrom(value)
        else:
            setattr(result, field.name, value)
    return result


__all__ = [
    "BackwardEdgeError",
    "GraphIndex",
    "Partition",
    "duplicate_names",
    "extract_part",
    "partition",
    "require_unique_names",
]
