"""Sharding inference's front (:func:`infer`, exported as ``sharding.infer``), and a staged model's inference.

:func:`infer` chooses: a model whose configuration puts nodes in pipeline
stages is inferred stage by stage (:func:`infer_by_stage`); any other, and a
candidate plan given as data (``written=``), as one graph
(:func:`sharding.infer.infer_graph`, which knows nothing of stages).

Inference for a model with pipeline stages: each stage on its own.

A tensor that crosses from one stage to the next is *sent*, not resharded
inside one SPMD program: the consumer stage receives it on its own devices.
So the op rules run stage by stage, each stage extracted as its own model
(`sharding.partition.extract_part`), and the results are merged. Problems of
the partition itself (duplicate names, backward edges, negative stages) are
``stage-invalid`` errors; each stage gets a ``pipeline-stage`` note saying
its nodes, devices and what it sends. `PartsMerger` does the merging, here
and for the jitted segments of a model with data-dependent shapes
(``sharding.segment_sharding``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx

from sharding import codes
from sharding.configuration import choose_configuration
from sharding.diagnostics import Diagnostic
from sharding.infer import infer_graph
from sharding.inference import Inference
from sharding.model_arg import ModelArg, as_model_proto
from sharding.model_configs import NodeConfig, device_configurations
from sharding.partition import extract_part
from sharding.rules.base import Shape
from sharding.shapes import infer_model
from sharding.written import WrittenAnnotations
from sharding.stages import has_stages, model_partition, stage_devices


def infer(
    model: ModelArg,
    configuration: str | None = None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
    shapes: tuple[Mapping[str, Shape], Sequence[Diagnostic]] | None = None,
    written: Mapping[str, NodeConfig] | None = None,
    annotations: WrittenAnnotations | None = None,
) -> Inference:
    """Completes the sharding annotations of a model: ``sharding.infer``, the one front of inference.

    A model whose configuration (the one asked for, else the model's first: a
    note says so when there are several) has ``pipeline_stage`` annotations is
    inferred stage by stage (:func:`infer_by_stage`; ``shapes`` is not used
    then: each stage's model is typed from one shape inference of the whole);
    any other model, and a candidate plan given as ``written=``, as one graph
    (:func:`sharding.infer.infer_graph`, whose docstring says every argument;
    ``annotations``, read once for the whole graph, serves that walk only).

    Returns:
        The `Inference`: every node's specs, every placed tensor's spec, and
        every problem found.

    Example:
        >>> result = infer(model)  # doctest: +SKIP
        >>> result.tensors["logits"]  # doctest: +SKIP
        ShardingSpec('logits', '2:4 @ [0,1,2,3]')
    """
    model = as_model_proto(model)
    if written is None:
        choice = choose_configuration(model, configuration)
        if choice.name is not None and has_stages(model, choice.name):
            return infer_by_stage(
                model, choice.name, choice.diagnostics, input_shapes=input_shapes, unsupported=unsupported
            )
    return infer_graph(
        model, configuration, input_shapes=input_shapes, unsupported=unsupported, shapes=shapes, written=written,
        annotations=annotations,
    )


def infer_by_stage(
    model: onnx.ModelProto,
    configuration: str,
    diagnostics: Sequence[Diagnostic] = (),
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
):
    """The inference of a staged model, one stage at a time (see the module docstring); :func:`infer` calls it.

    Each stage's model (:func:`stage_model`, without stages) goes through
    :func:`sharding.infer.infer_graph`. Every stage's inputs are typed from one
    shape inference of the whole model.

    Returns:
        One `Inference` holding every stage's nodes, tensors and diagnostics
        (after ``diagnostics``, those already found), nodes in graph order.
    """
    diags = list(diagnostics)
    try:
        part = model_partition(model, configuration)
        devices = stage_devices(
            model, configuration, part.parts, device_configurations(model)[configuration].num_devices
        )
    except ValueError as e:
        diags.append(Diagnostic(code=codes.STAGE_INVALID, severity="error", message=str(e)))
        return Inference(configuration, {}, {}, tuple(diags))
    merged = PartsMerger(configuration, diags)
    types = infer_model(model).value_types(model)
    for stage in part.parts:
        sends = sorted({t for t, f, _ in part.crossing if f == stage})
        merged.diagnostics.append(
            Diagnostic(
                code=codes.PIPELINE_STAGE,
                severity="note",
                message=f"stage {stage}: {len(part.nodes[stage])} nodes on devices {list(devices[stage])}"
                + (f"; sends {', '.join(sends)}" if sends else ""),
            )
        )
        sub = stage_model(model, part, stage, configuration, types)
        merged.add(
            part.nodes[stage], infer_graph(sub, configuration, input_shapes=input_shapes, unsupported=unsupported)
        )
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    merged.nodes = dict(sorted(merged.nodes.items(), key=lambda kv: order.get(kv[0], 0)))
    return merged.inference()


@dataclass
class PartsMerger:
    """One `Inference` from the inferences of a model's parts, each run on its own extracted model.

    A part's model also holds copies of other parts' nodes (recomputed
    producers), so each part contributes only its own nodes and the
    diagnostics about them (or about no node); a diagnostic several parts
    report is kept once. Tensors and shapes of every part are kept, later
    parts winning.

    Attributes:
        configuration: the device configuration inferred.
        diagnostics: those found so far, in order; callers may append their
            own between parts.
        nodes: the parts' own nodes, in the order they were added.
    """

    configuration: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    nodes: dict = field(default_factory=dict)
    tensors: dict = field(default_factory=dict)
    shapes: dict = field(default_factory=dict)
    _seen: set = field(default_factory=set)

    def add(self, own_nodes: Iterable[str], part: Inference) -> None:
        """Takes in one part's `Inference`, keeping only the nodes named in ``own_nodes``."""
        own = set(own_nodes)
        self.nodes.update((k, v) for k, v in part.nodes.items() if k in own)
        self.tensors.update(part.tensors)
        self.shapes.update(part.shapes)
        for d in part.diagnostics:
            key = (d.code, d.node, d.tensor, d.message)
            if key not in self._seen and (d.node is None or d.node in own):
                self._seen.add(key)
                self.diagnostics.append(d)

    def inference(self) -> Inference:
        """The merged `Inference`."""
        return Inference(self.configuration, self.nodes, self.tensors, tuple(self.diagnostics), self.shapes)


def stage_model(
    model: onnx.ModelProto, part, stage: int, configuration: str, types: Mapping[str, onnx.ValueInfoProto] | None = None
) -> onnx.ModelProto:
    """A stage as its own model, device numbers unchanged, without stages.

    Recomputed nodes of other stages lose their annotations; every node loses
    its ``pipeline_stage`` (so the stage model is an ordinary SPMD model).
    ``types``: as :func:`sharding.partition.extract_part`'s.
    """
    sub = extract_part(model, part, stage, types)
    own = set(part.nodes[stage])
    for node in sub.graph.node:
        keep = [c for c in node.device_configurations if node.name in own]
        for config in keep:
            config.ClearField("pipeline_stage")
        del node.device_configurations[:]
        node.device_configurations.extend(c for c in keep if c.sharding_spec)
    return sub


__all__ = ["PartsMerger", "infer", "infer_by_stage", "stage_model"]
