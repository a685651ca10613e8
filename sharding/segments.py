"""Segmented execution: jitted programs around the nodes whose output shapes depend on values.

XLA programs have static shapes. NonMaxSuppression, NonZero, Unique and
Compress produce outputs whose length depends on their input *values*; when
those values are computed at run time (not constants or shape computations,
which fold while tracing), the graph is cut at each such node
(DESIGN, "Data-dependent shapes: segments"). The parts before and after are
ordinary translated models, jitted and cached per shape signature; the node
itself runs on the host in numpy between them, and its output shapes
specialise the next segment. The cut uses the partition routine that pipeline
stages use (:mod:`sharding.partition`).

An If whose condition is computed at run time and whose branches return
outputs of different shapes (by ONNX shape inference) is cut the same way:
the host step reads the condition and runs the chosen branch as its own
jitted model (:mod:`onnx2jax.branch_step`). An If whose branches agree stays
inside its segment as ``lax.cond``. DictVectorizer and CastMap, which read a
map, are always host steps (:mod:`onnx2jax.ops.ml_maps`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from sharding.op_facts import DATA_DEPENDENT, VARIABLE_OUTPUTS
from sharding.partition import GraphIndex, Partition, extract_part, partition
from sharding.shapes import InferredModel, infer_model

MAP_READERS = ("DictVectorizer", "CastMap")
"""ai.onnx.ml ops whose input is a map (a Python dict), which XLA cannot hold: host steps always."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """One step of a segmented run.

    Attributes:
      kind: ``"jit"`` (a jitted program) or ``"host"`` (a data-dependent node in numpy).
      nodes: the nodes it runs (a host step: the node, plus any constants it recomputes).
      inputs: tensors it receives.
      outputs: tensors it hands to later segments or to the graph's outputs.
      reason: why a host step is cut out of the jitted programs ('' for a jitted one).
      op_type: a host step's op ('' for a jitted one).
      variable: a host step's outputs whose length depends on the values (the cause of the cut).
    """

    kind: str
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reason: str = ""
    op_type: str = ""
    variable: tuple[str, ...] = ()


def _label(node: onnx.NodeProto, index: int) -> str:
    return node.name or f"#{index}"


def may_cut(model: onnx.ModelProto) -> bool:
    """Whether any main-graph node may cut the graph (a data-dependent op, an If, a map reader)."""
    return any(node.op_type in DATA_DEPENDENT or node.op_type in ("If", *MAP_READERS) for node in model.graph.node)


def data_dependent_nodes(
    model: onnx.ModelProto, inferred: InferredModel | None = None
) -> list[tuple[int, onnx.NodeProto]]:
    """Main-graph nodes whose output shape depends on values computed at run time.

    A node whose value inputs are constants or follow from input shapes only
    folds while tracing and is not listed. An If is listed when its condition
    is computed at run time and its branches' outputs differ in shape
    (:func:`branch_shapes_differ`); ``inferred`` is the model's shape
    inference when the caller has it (else it runs here, for such an If only).
    """
    graph = model.graph
    if not may_cut(model):
        return []  # the common case: no graph index to build
    index = GraphIndex.of(graph)
    shape_only = index.shape_only()
    found = []
    runtime_ifs = []
    for i, node in enumerate(graph.node):
        if node.domain == "ai.onnx.ml" and node.op_type in MAP_READERS:
            found.append((i, node))
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "If" and node.input[0] not in shape_only:
            runtime_ifs.append(i)
        if node.op_type not in DATA_DEPENDENT:
            continue
        positions = DATA_DEPENDENT[node.op_type]
        names = [n for p, n in enumerate(node.input) if n and (positions is None or p in positions)]
        if any(n not in shape_only for n in names):
            found.append((i, node))
    if runtime_ifs:
        inferred = inferred or infer_model(model)
        found += [(i, graph.node[i]) for i in runtime_ifs if branch_shapes_differ(inferred.node(i))]
    return sorted(found, key=lambda pair: pair[0])


def _branches(node: onnx.NodeProto) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    graphs = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    return graphs["then_branch"], graphs["else_branch"]


def branch_shapes_differ(node: onnx.NodeProto) -> bool:
    """Whether an If's branches (shape-inferred) return tensors that surely differ in shape.

    Surely: a different rank or element type, or one dimension known in both
    and different. Unknown or symbolic dimensions may agree at run time, so
    such an If stays ``lax.cond`` (which checks while tracing).
    """
    then_branch, else_branch = _branches(node)
    return any(_shapes_differ(a.type, b.type) for a, b in zip(then_branch.output, else_branch.output))


def _shapes_differ(a: onnx.TypeProto, b: onnx.TypeProto) -> bool:
    if not (a.HasField("tensor_type") and b.HasField("tensor_type")):
        return False  # sequences and optionals: see graph_runner's container choices
    ta, tb = a.tensor_type, b.tensor_type
    if ta.elem_type and tb.elem_type and ta.elem_type != tb.elem_type:
        return True
    if not (ta.HasField("shape") and tb.HasField("shape")):
        return False
    if len(ta.shape.dim) != len(tb.shape.dim):
        return True
    return any(
        da.HasField("dim_value") and db.HasField("dim_value") and da.dim_value != db.dim_value
        for da, db in zip(ta.shape.dim, tb.shape.dim)
    )


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose main-graph nodes have unique names (the partition needs them)."""
    model = copy.deepcopy(model)
    seen: set[str] = set()
    for i, node in enumerate(model.graph.node):
        name = node.name
        if not name or name in seen:
            name = f"{node.op_type}__{i}"
            while name in seen:
                name += "_"
            node.name = name
        seen.add(name)
    return model


@dataclasses.dataclass
class SegmentPlan:
    """The cut model: its segments in run order and, for each, a runnable model."""

    segments: list[Segment]
    models: list[onnx.ModelProto]


def plan(
    model: onnx.ModelProto, cuts: Sequence[tuple[int, onnx.NodeProto]], inferred: InferredModel | None = None
) -> SegmentPlan:
    """Cuts ``model`` around the ``cuts`` (from :func:`data_dependent_nodes`).

    Part numbers follow graph order (which is topological): the nodes before
    the first cut form part 0, the cut itself part 1, and so on. Each part's
    inputs are typed from one shape inference of the model (``inferred``, when
    the caller has it).
    """
    named = _named(model)
    cut_at = {i for i, _ in cuts}
    part_of: dict[str, int] = {}
    part = 0
    for i, node in enumerate(named.graph.node):
        if i in cut_at:
            part = part + 1 if part % 2 == 0 else part + 2
            part_of[node.name] = part
        else:
            if part % 2 == 1:
                part += 1
            part_of[node.name] = part
    parts: Partition = partition(named.graph, part_of, what="segment")
    reasons = {named.graph.node[i].name: cut_reason(node) for i, node in cuts}
    cut_nodes = {named.graph.node[i].name: node for i, node in cuts}
    original = {named.graph.node[i].name: _label(n, i) for i, n in enumerate(model.graph.node)}
    types = (inferred or infer_model(model)).value_types(model)
    segments, models = [], []
    for p in parts.parts:
        host = p % 2 == 1
        nodes = parts.nodes[p]
        reason = reasons[nodes[0]] if host else ""
        cut = cut_nodes[nodes[0]] if host else None
        segments.append(
            Segment(
                "host" if host else "jit",
                tuple(original.get(n, n) for n in nodes),
                parts.inputs[p],
                parts.outputs[p],
                reason,
                cut.op_type if cut is not None else "",
                _variable_outputs(cut) if cut is not None else (),
            )
        )
        models.append(extract_part(named, parts, p, types))
    return SegmentPlan(segments, models)


def cut_reason(node: onnx.NodeProto) -> str:
    """Why ``node`` cuts the graph (its output shapes depend on values, or it reads a map), in words."""
    if node.op_type in MAP_READERS:
        return (
            f"{node.op_type} reads a map (a Python dict), which XLA cannot hold; it runs on the host and "
            "the next segment takes the tensor it makes"
        )
    if node.op_type == "If":
        return (
            "If's branches return outputs of different shapes and its condition is computed at run time; "
            "XLA needs static shapes, so the condition is read on the host and the chosen branch runs "
            "as its own jitted program"
        )
    return (
        f"{node.op_type}'s output length depends on the values of its inputs, computed at run time; "
        "XLA needs static shapes, so it runs on the host between jitted segments"
    )


def _variable_outputs(node: onnx.NodeProto) -> tuple[str, ...]:
    positions = VARIABLE_OUTPUTS.get(node.op_type, range(len(node.output)))
    return tuple(node.output[p] for p in positions if p < len(node.output) and node.output[p])


def describe(segments: Sequence[Segment]) -> list[str]:
    """One line per segment, in run order: what it runs and, for a host step, why it is cut."""
    lines = []
    for number, segment in enumerate(segments, 1):
        if segment.kind == "jit":
            lines.append(f"segment {number}: jitted program, {len(segment.nodes)} node(s)")
        else:
            lines.append(f"segment {number}: host step {', '.join(map(repr, segment.nodes))}: {segment.reason}")
    return lines


def run(
    plan_: SegmentPlan,
    runners: Sequence[Callable[[Mapping[str, Any]], Sequence[Any]]],
    bound: Mapping[str, Any],
    output_names: Sequence[str],
) -> tuple:
    """Runs the segments in order over the named inputs; returns the graph's outputs in order.

    ``runners[i]`` runs segment ``i`` on its named inputs and returns its
    outputs in the segment model's output order.
    """
    env: dict[str, Any] = dict(bound)
    for segment, model, runner in zip(plan_.segments, plan_.models, runners):
        values = {i.name: env[i.name] for i in model.graph.input if i.name in env}
        if segment.kind == "host":
            values = {k: np.asarray(v) for k, v in values.items()}
        outputs = runner(values)
        env.update(zip((o.name for o in model.graph.output), outputs))
    return tuple(env[name] for name in output_names)
