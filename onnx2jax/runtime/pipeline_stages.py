"""A pipeline's stages as values: each stage's program and tensors, the whole model's interface,
and how a stage model is renumbered onto its own devices and where its inputs go.

:func:`onnx2jax.runtime.pipeline.compile_pipeline` builds them;
:class:`onnx2jax.runtime.pipeline.PipelineCompiled` runs them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from onnx2jax.binding import InputInfo
from onnx2jax.input_checks import IndexCheck
from onnx2jax.runtime.constraints import SpecKey
from onnx2jax.runtime.spmd import Compiled
from sharding.model_configs import NodeConfig
from sharding.partition import Partition
from sharding.spec import remap_spec
from sharding.stage_infer import stage_model


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


__all__ = ["PipelineModel", "Stage", "local_stage_model", "stage_input_shardings"]
