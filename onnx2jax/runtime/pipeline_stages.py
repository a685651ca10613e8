"""A pipeline's stages: how they are made from the plan, and what they are (each stage's program and
tensors, the whole model's interface, how a stage model is renumbered onto its own devices and where its
inputs go).

:func:`compile_stages` makes them (for :func:`onnx2jax.runtime.pipeline.compile_pipeline`);
:class:`onnx2jax.runtime.pipeline.PipelineCompiled` runs them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from onnx2jax.binding import InputInfo, input_info
from onnx2jax.errors import DeviceCountError, NodeError
from onnx2jax.input_checks import IndexCheck
from onnx2jax.runtime.constraints import SpecKey
from onnx2jax.runtime.plan import Plan, program_plan
from onnx2jax.runtime.spmd import Compiled, translate_for
from sharding.model_configs import NodeConfig, device_configurations
from sharding.partition import Partition
from sharding.segments import cut_reason, data_dependent_nodes
from sharding.spec import remap_spec
from sharding.stage_infer import stage_model
from sharding.stages import model_partition, stage_devices


@dataclasses.dataclass
class Stage:
    """One pipeline stage.

    Attributes:
      stage: its ``pipeline_stage`` id.
      nodes: its nodes, in graph order (recomputed shape-only nodes excluded).
      devices: the configuration devices it runs on.
      compiled: its SPMD program (a :class:`~onnx2jax.runtime.spmd.Compiled`).
      inputs: tensors it receives (graph inputs and earlier stages' outputs).
      outputs: tensors it produces for later stages or the graph's outputs.
    """

    stage: int
    nodes: tuple[str, ...]
    devices: tuple[int, ...]
    compiled: Compiled
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    input_shardings: dict[str, NamedSharding] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PipelineModel:
    """The whole model's interface (what the stages together take and give), without parameters.

    Attributes:
      proto: the whole ModelProto.
      inputs: its runtime inputs (name, dtype, shape), in order.
      output_names: its outputs, in order.
      stage_layers: per stage, its program's ``layers_report()`` (whether its
        repeated layers run as one ``lax.scan``).
    """

    proto: onnx.ModelProto
    inputs: tuple[InputInfo, ...]
    output_names: tuple[str, ...]
    stage_layers: tuple[tuple[int, str], ...] = ()

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @functools.cached_property
    def index_check(self) -> IndexCheck:
        """The whole model's check of index inputs (:mod:`onnx2jax.input_checks`), as ``JaxModel`` holds one."""
        return IndexCheck(self.proto, self.input_names)

    def layers_report(self) -> str:
        """One line per stage, as ``JaxModel.layers_report`` says it for one program."""
        return "\n".join(f"stage {stage}: {line}" for stage, line in self.stage_layers)


def local_stage_model(
    proto: onnx.ModelProto,
    part: Partition,
    stage: int,
    configuration: str,
    group: Sequence[int],
    types: Mapping[str, onnx.ValueInfoProto],
) -> tuple[onnx.ModelProto, bool]:
    """The stage as a model whose specs use the group's own numbering 0..len(group)-1.

    Returns the model and whether it keeps any spec.
    """
    sub = stage_model(proto, part, stage, configuration, types)
    local = {d: i for i, d in enumerate(group)}
    annotated = False
    for node in sub.graph.node:
        kept = []
        for config_proto in node.device_configurations:
            if config_proto.configuration_id != configuration:
                continue
            specs = []
            for spec in NodeConfig.from_proto(config_proto).specs:
                outside = sorted(set(spec.all_devices()) - set(local))
                if outside:
                    raise ValueError(
                        f"node {node.name!r} (stage {stage}, devices {list(group)}): the spec of "
                        f"{spec.tensor_name!r} names devices {outside} outside its stage's group"
                    )
                specs.append(remap_spec(spec, local))
            annotated = True
            kept.append(NodeConfig(configuration, tuple(specs)).to_proto())
        del node.device_configurations[:]
        node.device_configurations.extend(kept)
    del sub.configuration[:]
    if annotated:
        sub.configuration.append(onnx.DeviceConfigurationProto(name=configuration, num_devices=len(group)))
    return sub, annotated


def stage_input_shardings(
    sub: onnx.ModelProto, placements: Mapping[SpecKey, Any], mesh: Mesh, names: Sequence[str]
) -> dict[str, NamedSharding]:
    """Where each stage input goes: the spec of its first reader in the stage, else replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    result = {}
    for name in names:
        result[name] = replicated
        for node in sub.graph.node:
            if name not in node.input:
                continue
            placement = placements.get(SpecKey(node.name, "in", list(node.input).index(name), name))
            if placement is not None and not placement.fused:
                result[name] = placement.sharding
            break
    return result


def compile_stages(plan: Plan) -> tuple[list[Stage], Partition, PipelineModel]:
    """Each stage of a staged model planned and compiled on its devices, with the partition and the whole
    model's interface (:mod:`onnx2jax.runtime.pipeline`'s module docstring says the steps).

    The plan's mesh (when given) lends its devices in row-major order, each
    configuration device at the flat position ``plan.devices`` gives it
    (default: device i at position i); else ``jax.devices()``. Each stage
    translates with the plan's ``scan_layers`` (:func:`~onnx2jax.runtime.spmd.translate_for`).

    Raises:
      ValueError: bad stages (duplicate names, backward edges, negative
        stages), a spec naming a device outside its stage's group, or
        ``devices`` not a permutation.
      DeviceCountError: too few devices.
      NodeError: a stage has nodes with data-dependent output shapes (naming the stage and node).
    """
    proto, configuration = plan.proto, plan.configuration
    num_devices = device_configurations(proto)[configuration].num_devices
    mesh = plan.mesh
    pool = list(mesh.devices.flat) if mesh is not None else jax.devices()
    if len(pool) < num_devices:
        raise DeviceCountError(
            configuration, num_devices, len(pool), mesh=mesh is not None, hint=len(jax.devices()) < num_devices
        )
    positions = list(plan.devices) if plan.devices is not None else list(range(num_devices))
    if sorted(positions) != list(range(num_devices)):
        raise ValueError(f"devices= must be a permutation of range({num_devices}), got {positions}")
    part = model_partition(proto, configuration)
    groups = stage_devices(proto, configuration, part.parts, num_devices)
    types = plan.inferred.value_types(proto)  # one shape inference types every stage's inputs
    models = {
        stage_id: local_stage_model(proto, part, stage_id, configuration, groups[stage_id], types) for stage_id in part.parts
    }
    for stage_id, (sub, _) in models.items():
        cuts = data_dependent_nodes(sub)
        if cuts:
            node = cuts[0][1]
            raise NodeError(
                f"node {node.name!r} (stage {stage_id}): {cut_reason(node)}. Pipeline stages with data-dependent "
                "output shapes inside them are not supported; compile the model without pipeline_stage"
            )
    stages = []
    for stage_id in part.parts:
        group = groups[stage_id]
        sub, annotated = models[stage_id]
        devices = [pool[positions[d]] for d in group]
        if annotated:
            program = program_plan(sub, configuration, None, check=plan.check, jax_devices=devices, shapes=plan.shapes)
        else:
            program = program_plan(sub, None, Mesh(np.array(devices), ("d0",)))
        # check_indices=False: the pipeline's call checks the whole model's inputs (input_checks)
        translated = translate_for(
            program, plan.external_dir, scan_layers=plan.scan_layers, check_indices=False, precision=plan.precision,
            compute_dtype=plan.compute_dtype,
        )
        compiled = Compiled(translated, program)
        stage = Stage(stage_id, part.nodes[stage_id], group, compiled, part.inputs[stage_id], part.outputs[stage_id])
        stage.input_shardings = stage_input_shardings(sub, program.placements, compiled.mesh, stage.inputs)
        stages.append(stage)
    initialized = {t.name for t in proto.graph.initializer}
    model = PipelineModel(
        proto,
        tuple(input_info(i) for i in proto.graph.input if i.name not in initialized),
        tuple(o.name for o in proto.graph.output),
        tuple((s.stage, s.compiled.model.layers_report()) for s in stages),
    )
    return stages, part, model


__all__ = ["PipelineModel", "Stage", "compile_stages", "local_stage_model", "stage_input_shardings"]
