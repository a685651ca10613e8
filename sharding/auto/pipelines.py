"""Pipeline x tensor candidates, weighed only where no data x tensor layout fits the memory limit.

For ``pipeline`` stages in ascending number (2, then 3, ... of the divisors of the device count):
the stages are cut by `sharding.stage_cut.auto_stages` (balanced by estimated time at the workload,
cut where one activation crosses), each on ``tensor = devices / pipeline`` consecutive devices, the
Megatron plan inside each (`sharding.stages.annotate_stages`). Unlike the data x tensor
candidates, each is written into a model (one copy per pipeline candidate, a few at most) because
inference reads stages from the model (`sharding.stage_infer`).

Predicted: the tensor-parallel collectives of every stage (inference's notes), each stage's
parameter bytes per device (a parameter with no spec on its reader lives whole on that reader's
stage devices), the activations that cross each cut (sent once per call, costed as a
collective-permute), and the FLOPs of each device's stage. One call's latency runs the stages one
after the other, so the stages' times add up; the pipeline's own schedule (micro-batches) is the
runtime's (`onnx2jax.runtime.pipeline`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import onnx

from sharding.auto.analysis import CONFIGURATION, Collective, Evaluation, PlanAnalysis
from sharding.stage_infer import infer
from sharding.model_configs import read_model_configs
from sharding.stage_cut import DEFAULT_SEQUENCE
from sharding.stages import StageAssignment, annotate_stages, auto_stages, device_groups


@dataclass(frozen=True)
class Pipeline:
    """One pipeline x tensor layout, written.

    Attributes:
        name: E.g. ``"pipeline 2 x tensor 4"``.
        pipeline: Stages.
        tensor: Devices per stage (the Megatron plan inside each).
        model: The annotated model (stages and specs, configuration ``auto``).
        crossing: Per cut, the tensors sent to the next stage.
    """

    name: str
    pipeline: int
    tensor: int
    model: onnx.ModelProto
    crossing: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()


def pipelines(analysis: PlanAnalysis, num_devices: int, batch: int | None, seq: int | None) -> Iterator[Pipeline]:
    """The pipeline x tensor layouts of the module docstring, fewest stages first."""
    for stages in range(2, num_devices + 1):
        if num_devices % stages:
            continue
        try:
            cut_stages, cut = auto_stages(analysis.model, stages, batch=batch or 1, sequence=seq or DEFAULT_SEQUENCE)
        except ValueError:  # fewer places to cut than stages
            return
        tensor = num_devices // stages
        model = annotate_stages(analysis.model, StageAssignment.one_group_per_stage(cut_stages), num_devices,
                                CONFIGURATION, tensor_parallel=tensor > 1)
        yield Pipeline(f"pipeline {stages} x tensor {tensor}", stages, tensor, model, tuple(cut.crossing),
                       tuple(cut.describe()))


def evaluate(analysis: PlanAnalysis, pipeline: Pipeline, num_devices: int) -> Evaluation:
    """What inference predicts for ``pipeline`` (module docstring), as an `Evaluation`."""
    inference = infer(pipeline.model, CONFIGURATION, input_shapes=analysis.input_shapes)
    configs = read_model_configs(pipeline.model).get(CONFIGURATION, {})
    groups = device_groups(list(range(pipeline.pipeline)), num_devices)
    devices = {node: groups[config.pipeline_stage] for node, config in configs.items()
               if config.pipeline_stage is not None}
    written = {node: config for node, config in configs.items() if config.specs}
    collectives = list(analysis.collectives(inference))
    for stage, tensors in enumerate(pipeline.crossing):
        for tensor in tensors:
            size = analysis.per_device(None, tensor, 1).get(0, 0)
            collectives.append(Collective("collective-permute", f"stage {stage} -> {stage + 1}", tensor, size, 2))
    return Evaluation(
        collectives=tuple(collectives),
        param_bytes=analysis.param_bytes(written, num_devices, devices),
        flops=analysis.flops(inference),
        activation_peak=analysis.activations(inference, max),
        activation_total=analysis.activations(inference, sum),
        errors=tuple(f"{d.node}: {d.message}" for d in inference.errors()),
        inference=inference,
    )


__all__ = ["Pipeline", "evaluate", "pipelines"]
