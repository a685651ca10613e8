"""The analysis of a compile, done once: a frozen :class:`Plan` every way of running takes.

``make_plan`` walks the one path, in order:

1. load the model (:func:`onnx2jax.loading.open_model`);
2. ONNX shape inference at the model's own shapes, once (:mod:`sharding.shapes`),
   for validation and inference alike;
3. validate the annotations (:func:`sharding.validate.require_valid`);
4. choose the device configuration by the one rule (:mod:`sharding.configuration`;
   a compile refuses the rule's guess among several);
5. the partition kind: ``"stages"`` (``pipeline_stage`` annotations),
   ``"segments"`` (nodes whose output shapes depend on values), else ``"whole"``;
6. for a whole model, inference and the mesh (:func:`program_plan`).

A :class:`ProgramPlan` is one SPMD program's analysis (a whole model, a
pipeline stage, a jitted segment): its inference at the model's own shapes,
its mesh and placements, and per call-shape signature its inference at the
call's shapes (:meth:`ProgramPlan.at_shapes`; the executable keeps it per signature: the plan is a frozen value
and caches nothing).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh

from onnx2jax.errors import ConfigurationError, TargetError
from onnx2jax.loading import ModelLike, open_model
from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.runtime.placements import mesh_for, placements_on, spec_layouts
from onnx2jax.runtime.targets import Target, has_attached_devices
from onnx2jax.runtime.user_mesh import auto_axes, context_mesh
from onnx2jax.scan import ScanSetting
from sharding.configuration import choose_configuration
from sharding.diagnostics import Diagnostic, ShardingError
from sharding.stage_infer import infer
from sharding.inference import Inference
from sharding.mesh.mapping import MeshMapping, map_specs
from sharding.rules.base import Shape
from sharding.segments import data_dependent_nodes, may_cut
from sharding.shapes import InferredModel, infer_model
from sharding.model_configs import device_configurations
from sharding.stages import has_stages
from sharding.validate import require_valid
from sharding.written import WrittenAnnotations, read_annotations

Shapes = tuple[Mapping[str, Shape], tuple[Diagnostic, ...]]  # tensor_shapes' result

Kind = Literal["whole", "stages", "segments"]


@dataclasses.dataclass(frozen=True)
class ProgramPlan:
    """One SPMD program's analysis: its annotated model, inference, mesh and placements.

    Attributes:
      proto: the program's annotated ModelProto (a whole model, a stage, a segment).
      configuration: its device configuration (None: unannotated, replicated on ``mesh``).
      inference: the completed annotations at the model's own shapes, or at a call's (:func:`whole_program`)
        (None: unannotated).
      mesh: the jax Mesh the program runs on.
      mapping: the specs mapped onto ``mesh`` (None: unannotated).
      placements: every laid-out spec as a TensorPlacement on ``mesh``.
      check: whether inference errors at a call's shapes refuse the call.
      structural: what ``sharding.validate`` found (sizes to check at each call).
      annotations: the annotations and order its inference read, read once (None: read by each inference),
        so that inference at a call's shapes reads only what the shapes change.
    """

    proto: onnx.ModelProto
    configuration: str | None
    inference: Inference | None
    mesh: Mesh
    mapping: MeshMapping | None
    placements: Mapping[SpecKey, TensorPlacement]
    check: bool = True
    structural: tuple[Diagnostic, ...] = ()
    annotations: WrittenAnnotations | None = None

    def at_shapes(
        self, input_shapes: Mapping[str, tuple[int, ...]]
    ) -> tuple[Inference, Mapping[SpecKey, TensorPlacement]]:
        """Inference and placements at a call's input shapes (a pure function of the plan: the executable
        keeps the result per shape signature, as :class:`~onnx2jax.runtime.spmd.Compiled` does).

        For an annotated program (``inference`` not None); an unannotated one has nothing to infer.

        The model's own inference serves when every shape is already concrete
        and every spec was laid out; else inference runs again at these shapes
        (a Reshape ``[B,H,S,D] -> [B*H,S,D]`` keeps its head split only when B is
        known) and its specs are mapped onto the same mesh, in the same device order.

        Raises:
          sharding.ShardingError: with ``check``, the annotations have errors at these shapes.
        """
        inference = self.inference
        laid_out = len(self.placements) == sum(
            spec is not None for node in inference.nodes.values() for spec in (*node.inputs, *node.outputs)
        )
        if laid_out and all(inference.shapes.get(name) == tuple(shape) for name, shape in input_shapes.items()):
            found = (inference, self.placements)
        else:
            inference = infer(
                self.proto, self.configuration, input_shapes=input_shapes, annotations=self.annotations
            )
            errors = inference.errors()
            if self.check and errors:
                raise ShardingError(list(errors))
            layouts = spec_layouts(inference, strict=True)
            mapping = map_specs(layouts, self.mapping.plan.device_array().size, self.mapping.plan)
            found = (inference, placements_on(mapping, layouts, self.mesh))
        return found


def program_plan(
    proto: onnx.ModelProto,
    configuration: str | None,
    mesh: Mesh | None,
    *,
    check: bool = True,
    devices: Sequence[int] | None = None,
    jax_devices: Sequence[jax.Device] | None = None,
    structural: Sequence[Diagnostic] = (),
    shapes: Shapes | None = None,
    inference: Inference | None = None,
    annotations: WrittenAnnotations | None = None,
    strict: bool = False,
    target: Target | None = None,
) -> ProgramPlan:
    """Inference and the mesh of one SPMD program at its model's own shapes.

    Args:
      mesh: the mesh to run on; None: one searched from the specs over
        ``jax_devices`` (default ``jax.devices()``; a pipeline stage passes its sub-mesh's).
      devices: with ``mesh``, the flat mesh position of each configuration device.
      shapes: the model's ``tensor_shapes``, when the caller has them.
      inference: the model's inference, when the caller has it (a segment's, inferred with its neighbours;
        one at a call's shapes, :func:`whole_program`).
      annotations: the annotations that inference read (kept for inference at other shapes).
      strict: ``inference`` is at a call's concrete shapes: every spec is laid out (as ``at_shapes`` lays
        them out), so that a call at those shapes infers nothing again.
      target: with no ``mesh`` and no ``jax_devices``, the compile target whose devices the searched mesh
        is laid over (:mod:`onnx2jax.runtime.targets`): the device count is the target's, not ``jax.devices()``'s.

    Raises:
      sharding.ShardingError: with ``check``, the annotations have errors.
      sharding.mesh.layout.MeshMappingError: a spec cannot be a NamedSharding on one mesh.
    """
    if configuration is None:
        pool = list(jax_devices) if jax_devices else target.devices() if target is not None else jax.devices()
        mesh = mesh or Mesh(np.array(pool[:1]), ("d0",))
        return ProgramPlan(proto, None, None, mesh, None, {}, check, tuple(structural))
    num_devices = device_configurations(proto)[configuration].num_devices
    if inference is None:
        annotations = read_annotations(proto, configuration)
        inference = infer(proto, configuration, shapes=shapes, annotations=annotations)
    errors = inference.errors()
    if check and errors:
        raise ShardingError(list(errors))
    # At the model's own shapes (not strict): a fused spec on a symbolic axis waits for the call's shapes.
    layouts = spec_layouts(inference, strict=strict)
    mesh, mapping = mesh_for(layouts, configuration, num_devices, mesh, devices, jax_devices, target)
    placements = placements_on(mapping, layouts, mesh)
    return ProgramPlan(
        proto, configuration, inference, mesh, mapping, placements, check, tuple(structural), annotations
    )


@dataclasses.dataclass(frozen=True)
class Plan:
    """The analysis of one compile, made once by :func:`make_plan`; every strategy takes it.

    Attributes:
      proto: the loaded model.
      external_dir: where its external data lives (None: inline).
      structural: the warnings and notes ``sharding.validate`` found.
      configuration: the device configuration chosen (None: unannotated).
      inferred: the model's one ONNX shape inference (None: unannotated and nothing
        that could cut it, so nothing needs it).
      kind: ``"whole"`` (one SPMD program), ``"stages"`` (pipeline) or ``"segments"``
        (data-dependent output shapes).
      mesh: the mesh the caller gave (or the enclosing ``jax.set_mesh``'s), None: searched.
      devices: with ``mesh``, the flat mesh position of each configuration device.
      check, microbatches, scan_layers: as :func:`onnx2jax.compile` was given them.
      program: for ``kind == "whole"``, the program's analysis (inference, mesh, placements).
      precision, compute_dtype: the matrix products' precision and the compute dtype (None: the model's own)
        every strategy translates with (:mod:`onnx2jax.numerics`).
      target: the compile target the mesh is searched over (None: ``jax.devices()``, or ``mesh``).
      read_weights: False for an ahead-of-time compile (a target, or a mesh of compile-only devices): the
        external weights' files are never opened, the model is translated with their shapes only.
    """

    proto: onnx.ModelProto
    external_dir: str | None
    structural: tuple[Diagnostic, ...]
    configuration: str | None
    inferred: InferredModel | None
    kind: Kind
    mesh: Mesh | None
    devices: tuple[int, ...] | None
    check: bool
    microbatches: int
    scan_layers: ScanSetting
    program: ProgramPlan | None = None
    precision: str = "auto"
    compute_dtype: str | None = None
    target: Target | None = None
    read_weights: bool = True

    @property
    def shapes(self) -> Shapes | None:
        """The inferred shapes and their diagnostics, as ``sharding.infer`` and ``validate`` take them."""
        return None if self.inferred is None else (self.inferred.shapes, self.inferred.diagnostics)


def make_plan(
    model: ModelLike,
    mesh: Mesh | None = None,
    *,
    configuration: str | None = None,
    check: bool = True,
    devices: Sequence[int] | None = None,
    microbatches: int = 1,
    scan_layers: ScanSetting = "auto",
    inferred: InferredModel | None = None,
    program: bool = True,
    target: Target | None = None,
) -> Plan:
    """The one analysis of a compile (see the module docstring); arguments as :func:`onnx2jax.compile`'s.

    ``inferred``: the model's shape inference when the caller already ran it (a generation handle runs it
    once for the Megatron plan it writes, and this plan takes it: one shape inference per model).
    ``program``: False leaves a ``"whole"`` plan's program unplanned, for :func:`whole_program` to plan at a
    call's shapes.

    Raises:
      onnx2jax.errors.ConfigurationError (a ValueError): the configuration asked for is not in the
        model, or the model has several and none was asked for, naming those it has.
      ValueError: ``microbatches`` without pipeline stages.
      sharding.ShardingError, sharding.mesh.layout.MeshMappingError: as :func:`program_plan`.
    """
    mesh = auto_axes(context_mesh() if mesh is None else mesh)
    ahead_of_time = target is not None or (mesh is not None and not has_attached_devices(mesh))
    proto, external_dir = open_model(model, weights=not ahead_of_time)  # a target's compile reads no weight
    annotated = any(node.device_configurations for node in proto.graph.node)
    if inferred is None and (annotated or may_cut(proto)):
        inferred = infer_model(proto)
    shapes = None if inferred is None or not annotated else (inferred.shapes, inferred.diagnostics)
    structural = tuple(require_valid(proto, shapes=shapes))
    choice = choose_configuration(proto, configuration)
    if choice.unknown:
        raise ConfigurationError(choice.defined, configuration)
    if choice.guessed:
        raise ConfigurationError(choice.defined)
    config = choice.name
    kind: Kind = "whole"
    if config is not None and has_stages(proto, config):
        kind = "stages"
    elif data_dependent_nodes(proto, inferred):
        kind = "segments"
    if kind != "stages" and microbatches != 1:
        raise ValueError(f"microbatches={microbatches} needs a model with pipeline stages; this one has none")
    if target is not None and mesh is not None:
        raise ValueError(f"give a target ({target.name}) or a mesh, not both")
    if target is not None and kind == "segments":
        raise TargetError(
            target.name, "compiling for a target is implemented for SPMD programs and pipeline stages; this model "
            "runs as segments around data-dependent shapes (their sizes are known only by running)",
        )
    if target is not None and kind == "stages":  # the stages take their sub-meshes from the target's chips
        mesh = Mesh(np.array(target.devices()), ("devices",))
    plan = Plan(
        proto, external_dir, structural, config, inferred, kind, mesh, None if devices is None else tuple(devices),
        check, microbatches, scan_layers, target=target, read_weights=not ahead_of_time,
    )
    if kind == "whole" and program:
        plan = dataclasses.replace(plan, program=whole_program(plan))
    return plan


def whole_program(plan: Plan, input_shapes: Mapping[str, tuple[int, ...]] | None = None) -> ProgramPlan:
    """``plan``'s one SPMD program (``kind == "whole"``) analysed at the model's own shapes, or at a call's
    ``input_shapes``: then the sharding inference that call needs is this one (``ProgramPlan.at_shapes`` at
    the same shapes reuses it), not a second walk of the graph. A generation handle plans its program at its
    first prefill's shapes this way (issue 28: one sharding inference before the first token).

    Raises:
      sharding.ShardingError, sharding.mesh.layout.MeshMappingError: as :func:`program_plan`.
    """
    common = dict(check=plan.check, devices=plan.devices, structural=plan.structural, target=plan.target)
    if input_shapes is None or plan.configuration is None:
        return program_plan(plan.proto, plan.configuration, plan.mesh, shapes=plan.shapes, **common)
    annotations = read_annotations(plan.proto, plan.configuration)
    inference = infer(plan.proto, plan.configuration, input_shapes=input_shapes, annotations=annotations)
    return program_plan(plan.proto, plan.configuration, plan.mesh, inference=inference,
                        annotations=annotations, strict=True, **common)


__all__ = ["Kind", "Plan", "ProgramPlan", "Shapes", "make_plan", "program_plan", "whole_program"]
