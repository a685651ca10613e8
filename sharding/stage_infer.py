"""Inference for a model with pipeline stages: each stage on its own.

A tensor that crosses from one stage to the next is *sent*, not resharded
inside one SPMD program: the consumer stage receives it on its own devices.
So the op rules run stage by stage, each stage extracted as its own model
(`sharding.partition.extract_part`), and the results are merged. Problems of
the partition itself (duplicate names, backward edges, negative stages) are
``stage-invalid`` errors; each stage gets a ``pipeline-stage`` note saying
its nodes, devices and what it sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from .diagnostics import Diagnostic
from .partition import extract_part
from .spec import device_configurations
from .stages import model_partition, stage_devices


def infer_by_stage(
    model: onnx.ModelProto,
    configuration: str,
    diagnostics: Sequence[Diagnostic] = (),
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
):
    """`sharding.infer.infer` of a staged model, one stage at a time (see the module docstring).

    Returns:
        One `Inference` holding every stage's nodes, tensors and diagnostics
        (after ``diagnostics``, those already found), nodes in graph order.
    """
    from .infer import Inference, infer

    diags = list(diagnostics)
    try:
        part = model_partition(model, configuration)
        devices = stage_devices(
            model, configuration, part.parts, device_configurations(model)[configuration].num_devices
        )
    except ValueError as e:
        diags.append(Diagnostic(code="stage-invalid", severity="error", message=str(e)))
        return Inference(configuration, {}, {}, tuple(diags))
    nodes, tensors, shapes, seen = {}, {}, {}, set()
    for stage in part.parts:
        sends = sorted({t for t, f, _ in part.crossing if f == stage})
        diags.append(
            Diagnostic(
                code="pipeline-stage",
                severity="note",
                message=f"stage {stage}: {len(part.nodes[stage])} nodes on devices {list(devices[stage])}"
                + (f"; sends {', '.join(sends)}" if sends else ""),
            )
        )
        sub = stage_model(model, part, stage, configuration)
        result = infer(sub, configuration, input_shapes=input_shapes, unsupported=unsupported)
        own = set(part.nodes[stage])
        nodes.update((k, v) for k, v in result.nodes.items() if k in own)
        tensors.update(result.tensors)
        shapes.update(result.shapes)
        for d in result.diagnostics:
            key = (d.code, d.node, d.tensor, d.message)
            if key not in seen and (d.node is None or d.node in own):
                seen.add(key)
                diags.append(d)
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    nodes = dict(sorted(nodes.items(), key=lambda kv: order.get(kv[0], 0)))
    return Inference(configuration, nodes, tensors, tuple(diags), shapes)


def stage_model(model: onnx.ModelProto, part, stage: int, configuration: str) -> onnx.ModelProto:
    """A stage as its own model, device numbers unchanged, without stages.

    Recomputed nodes of other stages lose their annotations; every node loses
    its ``pipeline_stage`` (so the stage model is an ordinary SPMD model).
    """
    sub = extract_part(model, part, stage)
    own = set(part.nodes[stage])
    for node in sub.graph.node:
        keep = [c for c in node.device_configurations if node.name in own]
        for config in keep:
            config.ClearField("pipeline_stage")
        del node.device_configurations[:]
        node.device_configurations.extend(c for c in keep if c.sharding_spec)
    return sub


__all__ = ["infer_by_stage", "stage_model"]
