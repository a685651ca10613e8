"""Sharding a segmented model: each jitted segment's annotations, and what crosses between segments.

A model cut around data-dependent nodes (:mod:`sharding.segments`) runs
sharded as one SPMD program per jitted segment, all on one mesh. Each segment
is an ordinary annotated model, so it goes through what compile() does for a
whole graph (validation, inference, mesh mapping). Three kinds of tensors
cross between segments, and the rules are the ones proposal 0007 gives for a
producer and its consumers:

* **jitted -> jitted** (a tensor a later jitted segment reads directly): it
  arrives placed as its producer left it, so the reading segment gets the
  producer's spec written on its readers that have none (0007: a missing
  input spec is the producer's output spec). No transfer, no collective.
* **-> host step (gather)**: the host runs numpy on the global array
  (``np.asarray`` of a ``jax.Array`` assembles every shard; the host holds it
  whole, as if fully replicated).
* **host step -> jitted (re-place)**: the host's output has no spec (0007:
  a model input is unsharded), so it is placed with the spec of its first
  reader in the next segment (the placement compile() gives any graph input;
  one that JAX cannot hold evenly goes replicated, ``holdable_sharding``).

This module is framework-neutral (onnx and `sharding` only): `onnx2jax
explain` uses it without jax, and :mod:`onnx2jax.runtime.segmented` runs it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnx.helper

from sharding.segments import Segment, SegmentPlan
from sharding.annotate import set_spec
from sharding.inference import Inference
from sharding.model_configs import NodeConfig
from sharding.spec import ShardingSpec
from sharding.stage_infer import PartsMerger, infer
from sharding.text import format_spec


@dataclasses.dataclass(frozen=True)
class Crossing:
    """One tensor moving into a segment.

    Attributes:
      tensor: its name.
      into: the receiving segment's index (0-based, run order).
      source: the producing segment's index, or None for a graph input.
      kind: ``"gather"`` (into a host step: the global array to numpy),
        ``"re-place"`` (from a host step into a jitted segment: placed with
        its first reader's spec), or ``"as placed"`` (from a jitted segment
        into a later one: passed on in its producer's sharding).
      reader: the first node of the receiving segment that reads it with a
        spec (``"re-place"`` and ``"as placed"``), else None.
      spec: the spec it is placed with (the reader's for a re-place, the
        producer's for a tensor passed as placed), or None for unsharded.
    """

    tensor: str
    into: int
    source: int | None
    kind: str
    reader: str | None = None
    spec: ShardingSpec | None = None


@dataclasses.dataclass
class ShardedSegments:
    """Per segment: the annotated model and its inference (None for a host step); the crossings."""

    plan: SegmentPlan
    configuration: str
    models: list[onnx.ModelProto | None]
    inferences: list[Inference | None]
    crossings: list[Crossing]

    @property
    def segments(self) -> list[Segment]:
        return self.plan.segments


def shard_segments(
    plan: SegmentPlan,
    configuration: str,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
) -> ShardedSegments:
    """Annotates each jitted segment of ``plan`` and infers its specs, in run order.

    A segment model keeps the specs of its own nodes (nodes it recomputes
    from other segments lose theirs), and a tensor it receives from an
    earlier jitted segment gets that segment's output spec on its readers
    that have none written.

    Args:
      input_shapes: concrete dims of the whole model's inputs (as for
        `sharding.infer`); each segment receives those of its own inputs.
    """
    producer: dict[str, int] = {}
    for index, segment in enumerate(plan.segments):
        for name in segment.outputs:
            producer.setdefault(name, index)
    models: list[onnx.ModelProto | None] = []
    inferences: list[Inference | None] = []
    crossings: list[Crossing] = []
    for index, (segment, model) in enumerate(zip(plan.segments, plan.models)):
        sources = {name: producer.get(name) for name in segment.inputs}
        if segment.kind == "host":
            models.append(None)
            inferences.append(None)
            crossings += [Crossing(name, index, sources[name], "gather") for name in segment.inputs]
            continue
        sub = _own_specs(model, segment)
        arriving = {}
        for name, source in sources.items():
            if source is not None and plan.segments[source].kind == "jit":
                spec = inferences[source].tensors.get(name) if inferences[source] is not None else None
                if spec is not None:
                    arriving[name] = spec
                    if spec.sharded_dims:  # unsharded is what a reader assumes anyway
                        _write_on_readers(sub, name, spec, configuration)
        own_shapes = {k: v for k, v in (input_shapes or {}).items() if k in {i.name for i in sub.graph.input}}
        for name, source in sources.items():  # sizes an earlier jitted segment knows
            known = inferences[source].shapes.get(name) if source is not None and inferences[source] else None
            if known is not None and all(isinstance(d, int) for d in known):
                own_shapes[name] = list(known)
        inference = infer(sub, configuration, input_shapes=own_shapes or None, unsupported=unsupported)
        models.append(sub)
        inferences.append(inference)
        for name, source in sources.items():
            if source is None:
                continue  # a graph input: placed as compile() places any input
            reader, spec = first_reader(sub, inference, name)
            kind = "re-place" if plan.segments[source].kind == "host" else "as placed"
            placed_as = arriving.get(name, spec) if kind == "as placed" else spec
            crossings.append(Crossing(name, index, source, kind, reader, placed_as))
    return ShardedSegments(plan, configuration, models, inferences, crossings)


def ignored_specs(sharded: ShardedSegments, index: int, configuration: str) -> list[str]:
    """Tensors a host step's node has specs written for: they do not apply, the node runs on the host."""
    names = []
    for node in sharded.plan.models[index].graph.node:
        if node.name not in sharded.segments[index].nodes:
            continue
        for proto in node.device_configurations:
            if proto.configuration_id == configuration:
                names += [s.tensor_name for s in NodeConfig.from_proto(proto).specs]
    return names


def merged_inference(sharded: ShardedSegments, configuration: str) -> Inference:
    """One `Inference` of the jitted segments' own nodes, in graph order (what ``explain`` lists).

    Host steps have none: their nodes run unsharded on the host.
    """
    merged = PartsMerger(configuration)
    for segment, inference in zip(sharded.segments, sharded.inferences):
        if inference is not None:
            merged.add(segment.nodes, inference)
    return merged.inference()


def describe(sharded: ShardedSegments) -> list[str]:
    """The segments, why each host step is cut, and each tensor crossing, with shapes and bytes (no run needed).

    A length known only at run time is written as its symbol (``?`` when it
    has none), and its bytes as bytes per unit of it.
    """
    types = tensor_types(sharded.plan)
    lines = []
    for index, segment in enumerate(sharded.segments):
        if segment.kind == "jit":
            lines.append(f"segment {index + 1}: jitted program, {len(segment.nodes)} node(s)")
        else:
            variable = ", ".join(map(repr, segment.variable))
            lines.append(
                f"segment {index + 1}: host step {segment.nodes[0]!r} ({segment.op_type}): "
                f"output {variable} has a data-dependent length. {segment.reason}"
            )
            lines += ignored_text(ignored_specs(sharded, index, sharded.configuration))
        for crossing in sharded.crossings:
            if crossing.into == index:
                lines.append("  " + _crossing_text(sharded, crossing, types))
    return lines


def ignored_text(tensors: Sequence[str]) -> list[str]:
    """The line saying a host step's written specs do not apply (none when it has none)."""
    if not tensors:
        return []
    return [f"  its specs written for {', '.join(map(repr, tensors))} do not apply: the node runs on the host"]


def _crossing_text(sharded: ShardedSegments, crossing: Crossing, types: Mapping) -> str:
    shape, dtype = types.get(crossing.tensor, ((), None))
    for inference in (_source_inference(sharded, crossing), sharded.inferences[crossing.into]):
        found = inference.shapes.get(crossing.tensor) if inference is not None else None
        if found is not None:
            shape = found
            break
    # ONNX shape inference names a length it cannot know "unk__N": say "?".
    shape = tuple(d if isinstance(d, int) else ("?" if not d or str(d).startswith("unk__") else d) for d in shape)
    what = f"{crossing.tensor!r} {list(shape)} {dtype or '?'} ({bytes_text(shape, dtype)})"
    source = "the graph input" if crossing.source is None else f"segment {crossing.source + 1}"
    spec = "unsharded" if crossing.spec is None else format_spec(crossing.spec)
    if crossing.kind == "gather":
        producer = _source_inference(sharded, crossing)
        left = producer.tensors.get(crossing.tensor) if producer is not None else None
        where = f", where it is {format_spec(left)}" if left is not None else ""
        return f"gather {what} from {source}{where} to the host: np.asarray of the global array"
    if crossing.kind == "re-place":
        reader = f"the spec of its first reader {crossing.reader!r}" if crossing.reader else "no reader has a spec"
        return f"re-place {what} from host step {crossing.source + 1} onto the mesh as {spec} ({reader})"
    return f"receive {what} from {source} as placed, {spec}: no transfer"


def _source_inference(sharded: ShardedSegments, crossing: Crossing) -> Inference | None:
    return None if crossing.source is None else sharded.inferences[crossing.source]


def _own_specs(model: onnx.ModelProto, segment: Segment) -> onnx.ModelProto:
    """A copy of a segment model whose recomputed nodes (another segment's) carry no specs.

    A recomputed node (a shape computation) runs where its reader runs.
    """
    sub = copy.deepcopy(model)
    own = set(segment.nodes)
    for node in sub.graph.node:
        if node.name not in own:
            del node.device_configurations[:]
    return sub


def _write_on_readers(model: onnx.ModelProto, tensor: str, spec: ShardingSpec, configuration: str) -> None:
    """Writes ``spec`` on every node input reading ``tensor`` that has no spec written for it."""
    for node in model.graph.node:
        if tensor not in node.input:
            continue
        written = any(
            s.tensor_name == tensor
            for proto in node.device_configurations
            if proto.configuration_id == configuration
            for s in NodeConfig.from_proto(proto).specs
        )
        if not written:
            set_spec(model, node.name, dataclasses.replace(spec, tensor_name=tensor), configuration)


def first_reader(
    model: onnx.ModelProto, inference: Inference, tensor: str
) -> tuple[str | None, ShardingSpec | None]:
    """The first node (graph order) reading ``tensor`` with a spec, and that spec; (None, None) if none.

    The same rule compile() uses to place a graph input (:func:`onnx2jax.runtime.placements.input_placements`).
    """
    for node in model.graph.node:
        found = inference.nodes.get(node.name)
        if found is None:
            continue
        for position, name in enumerate(node.input):
            if name == tensor and position < len(found.inputs) and found.inputs[position] is not None:
                return node.name, found.inputs[position]
    return None, None


def tensor_types(plan: SegmentPlan) -> dict[str, tuple[tuple, np.dtype | None]]:
    """Shape and dtype of every tensor that crosses a segment boundary, from the segment models' typing."""
    types: dict[str, tuple[tuple, np.dtype | None]] = {}
    for model in plan.models:
        for info in list(model.graph.input) + list(model.graph.output):
            if info.name in types or not info.type.HasField("tensor_type"):
                continue
            tensor = info.type.tensor_type
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type) if tensor.elem_type else None
            shape = ()
            if tensor.HasField("shape"):
                dims = tensor.shape.dim
                shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
            types[info.name] = (shape, np.dtype(dtype) if dtype is not None else None)
    return types


def bytes_text(shape: Sequence, dtype: np.dtype | None) -> str:
    """``"576 B"`` for a known shape; ``"24 B x k"`` when some dims are known only at run time."""
    if dtype is None:
        return "? B"
    known = [d for d in shape if isinstance(d, int)]
    unknown = [str(d) for d in shape if not isinstance(d, int)]
    size = math.prod(known) * dtype.itemsize
    return f"{size:,} B" + "".join(f" x {u}" for u in unknown)


__all__ = [
    "Crossing",
    "ShardedSegments",
    "bytes_text",
    "describe",
    "first_reader",
    "ignored_specs",
    "ignored_text",
    "merged_inference",
    "shard_segments",
    "tensor_types",
]
