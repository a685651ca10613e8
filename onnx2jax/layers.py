"""Finding the repeated layer of a transformer export: pure ONNX analysis, no jax.

A transformer export is a prefix (embeddings, masks, rotary tables), N copies
of one layer and a suffix (final norm, head). Each copy is the same subgraph
up to its initializers: the same ops with the same attributes in the same
order, wired the same way, reading initializers of the same shapes and dtypes
(each layer its own: parameters are told apart by name, never by value, so no weight is read). Layer k's output (the residual
stream; the *carry*) is layer k+1's input. Everything else a layer reads from
outside itself is *loop-invariant*: graph inputs, values computed in the
prefix and read by every layer (attention masks, position ids, rotary cos/sin),
and initializers every layer shares by name (or, for a compile-time constant, holds with equal values).

:func:`find_repeated_layers` finds the longest such chain in the stored node
order (exporters emit one layer's nodes together, in module order) and
returns a :class:`Repetition` saying where the layers are and which
initializers stack, or the reason it found none (:attr:`Repetition.reason`).
The translator runs such a chain as one ``jax.lax.scan`` over stacked
parameters (:mod:`onnx2jax.scan`), so compile time stops growing with depth.

Node names are never compared: two layers compare equal when their node
sequences have equal *labels* (domain, op type, attributes with values,
which inputs are initializers of which shape and dtype) and equal wiring
(checked position by position in :func:`_verify`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx.numpy_helper

from sharding.partition import GraphIndex

MIN_LAYER_NODES = 4
"""A repeated block of fewer nodes is not a layer (repeated Unsqueezes, say)."""


@dataclasses.dataclass(frozen=True)
class Repetition:
    """Where the repeated layers of a graph are, or why there are none.

    Attributes:
      order: the graph's node indices in the order the analysis uses: every
        node whose value follows from input shapes and constants alone first
        (exporters that deduplicate common subexpressions leave the shared
        head-shape vectors and rotary slices inside the first layer; hoisted,
        every layer reads them as loop invariants), then the others, each
        group in stored order. ``start`` and ``length`` index into it.
      start: position in ``order`` of the first layer's first node.
      length: nodes per layer.
      count: how many layers (0 when none was found).
      carry_in: tensors the first layer reads that later layers take from the
        previous layer (the residual stream), in order.
      carry_out: for each ``carry_in``, the tensor of the *first* layer that
        feeds the next layer's copy of it.
      outputs: for each ``carry_in``, the tensor of the *last* layer that
        follows it (what the suffix reads).
      stacked: first layer's initializer name -> every layer's initializer
        for that slot (first layer's included), for slots each layer reads under
        its own name (a constant's per-layer copies of one value excepted). Stack them
        along a new leading axis.
      shared: first layer's initializer names read by every layer with the
        same value (shared by name, or per-layer copies of one constant's value).
      invariants: tensors computed outside the layers (graph inputs, prefix
        values) that every layer reads under the same name.
      reason: why no repetition was found ('' when one was).
    """

    order: tuple[int, ...] = ()
    start: int = 0
    length: int = 0
    count: int = 0
    carry_in: tuple[str, ...] = ()
    carry_out: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    stacked: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    shared: tuple[str, ...] = ()
    invariants: tuple[str, ...] = ()
    reason: str = ""

    @property
    def found(self) -> bool:
        return self.count >= 2

    def layer_nodes(self, k: int) -> tuple[int, ...]:
        """Indices in ``graph.node`` of layer ``k``'s nodes, in run order."""
        first = self.start + k * self.length
        return self.order[first : first + self.length]

    def prefix_nodes(self) -> tuple[int, ...]:
        """Indices in ``graph.node`` of the nodes that run before the layers."""
        return self.order[: self.start]

    def suffix_nodes(self) -> tuple[int, ...]:
        """Indices in ``graph.node`` of the nodes that run after the layers."""
        return self.order[self.start + self.count * self.length :]

    def describe(self) -> str:
        """One line: what was found, or why nothing was."""
        if not self.found:
            return f"no repeated layer: {self.reason}"
        return (
            f"{self.count} repeated layers of {self.length} nodes, "
            f"{len(self.stacked)} stacked parameter(s) per layer, {len(self.carry_in)} carried tensor(s) "
            f"{list(self.carry_in)}, {len(self.invariants)} loop-invariant input(s)"
        )


class _NoMatch(Exception):
    """A candidate chain of blocks fails verification; the message says where and why."""


def _attribute_key(attr: onnx.AttributeProto) -> tuple:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.TensorProto):
        array = onnx.numpy_helper.to_array(value)
        return (attr.name, array.dtype.str, array.shape, array.tobytes())
    if isinstance(value, onnx.GraphProto):
        return (attr.name, value.SerializeToString())  # outer names differ per layer: rarely equal
    if isinstance(value, list):
        return (attr.name, tuple(v.SerializeToString() if hasattr(v, "SerializeToString") else v for v in value))
    return (attr.name, value)


def canonical_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices: the shape-only nodes first, then the rest, each in stored order (still topological).

    A shape-only node's inputs are all shape-only (:meth:`GraphIndex.shape_only`),
    so moving the group ahead keeps every producer before its consumers.
    """
    index = GraphIndex.of(graph)
    shape_only = index.shape_only()
    hoisted = [
        i for i, node in enumerate(graph.node)
        if any(o for o in node.output) and all(o in shape_only for o in node.output if o)
    ]
    moved = set(hoisted)
    return hoisted + [i for i in range(len(graph.node)) if i not in moved]


def _labels(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]) -> list[tuple]:
    """A hashable label per node: op, attributes and the kind of each input, never names."""
    inits = {i.name: (i.data_type, tuple(i.dims)) for i in graph.initializer}
    labels = []
    for node in nodes:
        kinds = tuple(
            ("", ) if not name else ("init", *inits[name]) if name in inits else ("value",)
            for name in node.input
        )
        attrs = tuple(sorted(_attribute_key(a) for a in node.attribute))
        outs = tuple(bool(o) for o in node.output)
        labels.append((node.domain or "", node.op_type, attrs, kinds, outs))
    return labels


def _candidates(ids: np.ndarray) -> list[tuple[int, int, int]]:
    """(start, period, length) of every maximal periodic run of the label sequence, best cover first.

    A run of ``length`` nodes from ``start`` has period ``period``: it holds
    ``(length - phase) // period`` whole blocks starting at ``start + phase``.
    """
    n = len(ids)
    found = []
    for period in range(MIN_LAYER_NODES, n // 2 + 1):
        equal = ids[:-period] == ids[period:]
        # Maximal runs of True: a[i] == a[i + period] for i in [r0, r0 + run).
        padded = np.concatenate([[False], equal, [False]])
        edges = np.flatnonzero(padded[1:] != padded[:-1])
        for r0, r1 in zip(edges[::2], edges[1::2]):
            run = r1 - r0
            if run >= period:
                found.append((int(r0), period, int((run + period) // period), int(run + period)))
    # Most nodes covered first; then the shorter period (more, smaller layers).
    found.sort(key=lambda c: (-(c[2] * c[1]), c[1], c[0]))
    return [(s, p, length) for s, p, _, length in found]


ArrayOf = Callable[[str], "np.ndarray | None"]
"""Initializer name -> its value when it is a compile-time constant (compared between layers), or None for a
parameter: layers' parameters are told apart by name and graph type, never by reading their values."""


def find_repeated_layers(graph: onnx.GraphProto, array_of: ArrayOf | None = None) -> Repetition:
    """The longest chain of repeated layers in ``graph``'s main node list.

    Args:
      graph: the model's main graph (functions inlined).
      array_of: initializer name -> its value for a compile-time constant (per-layer copies of one
        constant are shared, not stacked), None for a parameter (each layer's own initializer is a
        stacked slot, whatever its values: repeated layers are recognised from structure and shapes,
        and no weight is read). Default: inline non-float initializers are constants, the rest parameters.

    Returns:
      a :class:`Repetition`; ``found`` is false and ``reason`` says why when
      no chain of at least two layers passes the checks.
    """
    if len(graph.node) < 2 * MIN_LAYER_NODES:
        return Repetition(reason=f"the graph has {len(graph.node)} nodes, too few for two layers of {MIN_LAYER_NODES}")
    order = canonical_order(graph)
    nodes = [graph.node[i] for i in order]
    if array_of is None:
        by_name = {i.name: i for i in graph.initializer}
        array_of = lambda name: _constant_value(by_name[name])  # noqa: E731
    labels = _labels(graph, nodes)
    table: dict[tuple, int] = {}
    ids = np.array([table.setdefault(label, len(table)) for label in labels])
    candidates = _candidates(ids)
    if not candidates:
        return Repetition(reason=f"no block of {MIN_LAYER_NODES} or more nodes repeats with the same ops, attributes and initializer shapes")
    index = _Index(graph, nodes)
    reasons = []
    for start, period, covered in candidates[:50]:
        # Any phase of a periodic run repeats. Of those that wire up as a chain of layers, keep
        # the most layers, then the fewest carried tensors (a layer cut at its residual stream).
        valid: list[Repetition] = []
        for phase in range(period):
            count = (covered - phase) // period  # non-increasing in phase
            if count < 2 or (valid and (count < valid[0].count or len(valid[0].carry_in) == 1)):
                break  # no later phase can beat the first chain found
            try:
                valid.append(_verify(index, start + phase, period, count, array_of))
            except _NoMatch as err:
                reasons.append(str(err))
        if valid:
            best = min(valid, key=lambda r: (-r.count, len(r.carry_in), r.start))
            return dataclasses.replace(best, order=tuple(order))
    best = candidates[0]
    return Repetition(
        reason=(
            f"the best repeated run ({best[2] // best[1]} blocks of {best[1]} nodes at node {best[0]}) is not a chain of layers: "
            + (reasons[0] if reasons else "no phase of it wires up")
        )
    )


class _Index:
    """Producers and consumers by position in the canonical order."""

    def __init__(self, graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto]):
        self.nodes = list(nodes)
        self.inits = {i.name for i in graph.initializer}
        self.graph_outputs = {o.name for o in graph.output}
        self.producer: dict[str, tuple[int, int]] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for o, name in enumerate(node.output):
                if name:
                    self.producer[name] = (i, o)
            for name in node.input:
                if name:
                    self.consumers.setdefault(name, []).append(i)
        self.types: dict[str, tuple[int, tuple[int | str | None, ...] | None]] = {}
        for info in [*graph.input, *graph.value_info, *graph.output]:
            tensor = info.type.tensor_type
            dims = None
            if tensor.HasField("shape"):
                dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
            self.types[info.name] = (tensor.elem_type, dims)
        # Nodes with subgraphs: their bodies' outer-scope reads are not compared.
        self.with_subgraph = {
            i for i, node in enumerate(self.nodes)
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
        }


@dataclasses.dataclass(frozen=True)
class _Where:
    """Names a compared input pair in a mismatch message (formatted only when one is raised)."""

    index: _Index
    node: int
    first: int
    slot: int
    a: str
    b: str
    layer: int

    def __str__(self) -> str:
        return (
            f"{_name(self.index, self.node)} input {self.slot} ({self.b!r}, layer {self.layer}) "
            f"vs {_name(self.index, self.first)} ({self.a!r}, layer 0)"
        )


def _name(index: _Index, i: int) -> str:
    node = index.nodes[i]
    return f"node {node.name or '#' + str(i)!r} ({node.op_type})"


def _verify(index: _Index, start: int, length: int, count: int, array_of: ArrayOf) -> Repetition:
    """Checks that ``count`` blocks of ``length`` nodes from ``start`` wire up as a chain of layers.

    Raises:
      _NoMatch: naming the first node and input that breaks the pattern.
    """
    nodes = index.nodes
    end = start + length * count
    if any(start <= i < end for i in index.with_subgraph):
        raise _NoMatch("a layer holds a node with a subgraph (If/Loop/Scan), whose outer reads are not compared")
    # external name of layer 0 -> per layer k its counterpart
    external: dict[str, list[str]] = {}
    carry_pos: dict[str, tuple[int, int]] = {}  # layer-0 external -> (relative node, output) of the previous layer
    for k in range(1, count):
        base = start + k * length
        for j in range(length):
            n0, nk = nodes[start + j], nodes[base + j]
            for slot, (a, b) in enumerate(zip(n0.input, nk.input)):
                where = _Where(index, base + j, start + j, slot, a, b, k)
                if not a or not b:
                    if a != b:
                        raise _NoMatch(f"{where}: one is empty")
                    continue
                pa = index.producer.get(a)
                if pa is not None and start <= pa[0] < start + length:  # internal to layer 0
                    pb = index.producer.get(b)
                    if pb is None or (pb[0] - base, pb[1]) != (pa[0] - start, pa[1]):
                        raise _NoMatch(f"{where}: not produced by the same node of its layer")
                    continue
                seen = external.setdefault(a, [a] + [""] * (count - 1))
                if seen[k] and seen[k] != b:
                    raise _NoMatch(f"{where}: layer 0 reads {a!r} in two places, layer {k} reads two tensors")
                seen[k] = b
                if a in index.inits:
                    if b not in index.inits:
                        raise _NoMatch(f"{where}: an initializer in layer 0 only")
                    continue
                if b == a:
                    if a in carry_pos:
                        raise _NoMatch(f"{where}: carried into some layers, shared by others")
                    continue
                pb = index.producer.get(b)
                prev = start + (k - 1) * length
                if pb is None or not prev <= pb[0] < prev + length:
                    raise _NoMatch(
                        f"{where}: neither the same tensor nor the previous layer's output "
                        "(a per-layer value computed outside the layer)"
                    )
                rel = (pb[0] - prev, pb[1])
                if carry_pos.setdefault(a, rel) != rel:
                    raise _NoMatch(f"{where}: carried from a different node than in earlier layers")
                if any(external[a][m] == a for m in range(1, k)):
                    raise _NoMatch(f"{where}: carried into some layers, shared by others")
    carry_in = tuple(sorted(carry_pos))
    if not carry_in:
        raise _NoMatch("no layer reads the previous layer's output (the blocks are not chained)")
    carry_out = tuple(nodes[start + carry_pos[a][0]].output[carry_pos[a][1]] for a in carry_in)
    for a, b in zip(carry_in, carry_out):
        if _differ(index.types.get(a), index.types.get(b)):
            raise _NoMatch(
                f"carried tensor {a!r} {index.types[a][1]} becomes {b!r} {index.types[b][1]} after one layer "
                "(a scan's carry keeps its shape and dtype)"
            )
    last = start + (count - 1) * length
    outputs = tuple(nodes[last + carry_pos[a][0]].output[carry_pos[a][1]] for a in carry_in)
    _check_escapes(index, start, length, count, carry_pos)
    stacked: dict[str, tuple[str, ...]] = {}
    shared: list[str] = []
    for a, names in external.items():
        if a not in index.inits:
            continue
        if all(n == a for n in names):
            shared.append(a)
            continue
        first = array_of(a)
        if first is not None and all(_equal(array_of(n), first) for n in names[1:]):
            shared.append(a)  # a compile-time constant with one value in every layer
        else:
            stacked[a] = tuple(names)
    invariants = tuple(sorted(a for a in external if a not in index.inits and a not in carry_pos))
    return Repetition(
        start=start,
        length=length,
        count=count,
        carry_in=carry_in,
        carry_out=carry_out,
        outputs=outputs,
        stacked=stacked,
        shared=tuple(sorted(shared)),
        invariants=invariants,
    )


def _constant_value(tensor: onnx.TensorProto) -> np.ndarray | None:
    """An inline non-float initializer's value (a constant); None for a float or external one (a parameter)."""
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
    if tensor.data_type in floats or onnx.external_data_helper.uses_external_data(tensor):
        return None
    return onnx.numpy_helper.to_array(tensor)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal arrays; a few leading elements first, since layers' weights differ almost everywhere."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.size and not np.array_equal(a.reshape(-1)[:16], b.reshape(-1)[:16]):
        return False
    return bool(np.array_equal(a, b))


def _differ(a: tuple | None, b: tuple | None) -> bool:
    """Whether two recorded (elem type, dims) may differ: a fixed dim against a symbolic one
    counts (a broadcast [1, seq, 64] is not a [batch, seq, 64]); an unknown one never does."""
    if a is None or b is None:
        return False
    if a[0] and b[0] and a[0] != b[0]:
        return True
    if a[1] is None or b[1] is None:
        return False
    if len(a[1]) != len(b[1]):
        return True
    return any(x is not None and y is not None and x != y for x, y in zip(a[1], b[1]))


def _check_escapes(index: _Index, start: int, length: int, count: int, carry_pos: Mapping[str, tuple[int, int]]) -> None:
    """Only carried tensors may leave a layer: to the next layer, or from the last one to the suffix."""
    carried = set(carry_pos.values())
    end = start + length * count
    for k in range(count):
        base = start + k * length
        for j in range(length):
            node = index.nodes[base + j]
            for o, name in enumerate(node.output):
                if not name:
                    continue
                is_carry = (j, o) in carried
                outside = [c for c in index.consumers.get(name, []) if not base <= c < base + length]
                for c in outside:
                    next_layer = base + length <= c < base + 2 * length and c < end
                    after = c >= end and k == count - 1
                    if not is_carry or not (next_layer or after):
                        raise _NoMatch(
                            f"{_name(index, base + j)} output {name!r} of layer {k} is read by {_name(index, c)} "
                            "outside the layer chain (only the carried stream may leave a layer)"
                        )
                if name in index.graph_outputs and not (is_carry and k == count - 1):
                    raise _NoMatch(f"{_name(index, base + j)} output {name!r} of layer {k} is a graph output")
