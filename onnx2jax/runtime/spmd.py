"""``onnx2jax.compile(model, mesh)``: sharded execution through XLA's SPMD partitioner.

The steps, in order:

1. load and translate the model (:mod:`onnx2jax.translate`);
2. check its annotations and complete them (:func:`sharding.infer`): every
   node input and output on the sharded path gets a spec;
3. map every spec onto one jax ``Mesh`` (:mod:`sharding.mesh.layout`), or use the
   mesh the caller gives;
4. place the initializers sharded, each device receiving only its slice, once
   per distinct layout their consumers ask for (:mod:`onnx2jax.runtime.parameters`);
5. per input shape signature of a call: infer again at those concrete shapes
   (a Reshape that fuses a sharded axis with a symbolic one needs them), map
   the specs onto the mesh, trace the graph with ``with_sharding_constraint``
   on every node input and output that has a spec, and jit it; XLA inserts
   the collectives.

Where values live on the mesh (spec layouts, placements, the inputs' and
outputs' shardings) is :mod:`onnx2jax.runtime.placements`; what ``report()``
measures is :mod:`onnx2jax.runtime.report`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh

import sharding
from onnx2jax.runtime.report import (  # count_collectives and param_bytes_per_device: imported from here too
    Report,
    count_collectives,
    example_inputs,
    loop_note,
    node_rows,
    param_bytes_per_device,
)
from onnx2jax.runtime.constraints import Placement, ShardingHooks, SpecKey
from onnx2jax.errors import NodeError
from onnx2jax.runtime.fast_call import FastCall, call_key, moved_inputs
from onnx2jax.loading import ModelLike, open_model
from sharding.mesh.mapping import MeshMapping, map_specs
from onnx2jax.runtime.parameters import ParameterStore
from onnx2jax.runtime.placements import (
    input_placements,
    mesh_for,
    output_placements,
    output_shardings,
    place_on_mesh,
    placements_on,
    spec_layouts,
)
from onnx2jax.scan import ScanSetting, per_layer_names
from onnx2jax.runtime.scan_sharded import layer_specs_differ, place_stacked
from onnx2jax.runtime.sizes_at_call import SizesAtCall
from onnx2jax.translate import JaxModel
from onnx2jax.runtime.user_mesh import auto_axes, auto_input, context_mesh, tracing
from onnx2jax.runtime.xla_options import compiler_options
from sharding.diagnostics import Diagnostic, ShardingError
from sharding.spec import device_configurations
from sharding.stages import has_stages
from sharding.validate import require_valid

if TYPE_CHECKING:
    from onnx2jax.runtime.pipeline import PipelineCompiled
    from onnx2jax.runtime.segmented import SegmentedCompiled

@dataclasses.dataclass(frozen=True)
class _Signature:
    """What depends on one call's input shapes: inference, specs on the mesh, output placements."""

    inference: "sharding.Inference"
    placements: dict[SpecKey, Placement]
    out_placements: tuple  # per graph output, its producer's placement or None
    in_placements: dict[str, Placement]  # per graph input, its first annotated reader's placement


class Compiled:
    """A model compiled for a mesh. Call it like the model; see :func:`compile`.

    Inference runs again with the concrete shapes of each call's shape
    signature (a Reshape ``[B,H,S,D] -> [B*H,S,D]`` keeps its head split only
    when B is known), and the program is specialised per signature; the mesh
    and the parameters are fixed at compile time.

    Attributes:
      model: the translated :class:`~onnx2jax.translate.JaxModel`.
      mesh: the jax Mesh every sharding lives on.
      inference: the completed annotations at the model's own (possibly
        symbolic) shapes (None for an unannotated model).
      params: the initializers as jax.Arrays, placed with the sharding of
        their first annotated consumer. A parameter with a fused-axis spec is
        held in its unfused shape (for example a [H, 2F] gate/up weight as
        [H, 2, F]); one whose sharded axes do not divide evenly is held
        zero-padded. ``logical_params`` gives the ONNX shapes back.
      param_copies: further copies of parameters whose consumers want other
        layouts (``"name#k"``), so that no call reshards a constant.
    """

    def __init__(
        self,
        model: JaxModel,
        mesh: Mesh,
        inference: "sharding.Inference | None",
        placements: dict[SpecKey, Placement],
        mapping: MeshMapping | None,
        configuration: str | None,
        *,
        check: bool = True,
        structural: Sequence[Diagnostic] = (),
    ):
        self.model = model
        self.mesh = mesh
        self.inference = inference
        self.configuration = configuration
        self._placements = placements
        self._mapping = mapping
        params: Mapping[str, np.ndarray] = model.params
        if model.scan.active:
            why = layer_specs_differ(model.proto, model.scan, placements, model.params)
            if why:
                model.unscan(why)
            else:  # each layer's parameters live only in the stacked copies
                scanned = per_layer_names(model.scan)
                params = {k: v for k, v in model.params.items() if k not in scanned}
        self._store = ParameterStore(mesh, params, placements)
        self.params = self._store.arrays
        if model.scan.active:
            self.params.update(place_stacked(model.proto, model.scan, placements, model._stacked, mesh))
        self.param_copies = self._store.copies
        self.check = check  # refuse a call whose shapes give the annotations errors
        self._signatures: dict[tuple, _Signature] = {}
        self._jitted: dict[tuple, Any] = {}
        self._last_args: tuple | None = None
        self._fast_calls: dict[Hashable, FastCall] = {}  # per call_key: the compiled short path
        # dim_values written on symbolic axes are checked against each call's shapes (fused
        # axes are checked as they are laid out per call, in spec_layouts).
        self._sizes = SizesAtCall(model.proto, structural)

    # -- parameters -------------------------------------------------------

    def _logical_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._store.logical(name, value) for name, value in params.items()}

    @property
    def stored_params(self) -> dict[str, jax.Array]:
        """Every array placed for the parameters: ``params`` and ``param_copies`` together."""
        return {**self.params, **self.param_copies}

    @property
    def logical_params(self) -> dict[str, jax.Array]:
        """The parameters in their ONNX shapes (fused views folded, padding removed)."""
        return self._logical_params(self.params)

    # -- per shape signature ----------------------------------------------

    def _signature(self, key: tuple, input_shapes: Mapping[str, tuple[int, ...]]) -> _Signature:
        """Inference, placements and output shardings for one input shape signature (cached)."""
        found = self._signatures.get(key)
        if found is not None:
            return found
        if self.inference is None:
            found = _Signature(None, {}, (None,) * len(self.model.output_names), {})
        else:
            proto = self.model.proto
            self._sizes.check(input_shapes)
            laid_out = len(self._placements) == sum(
                spec is not None for node in self.inference.nodes.values() for spec in (*node.inputs, *node.outputs)
            )
            if laid_out and all(self.inference.shapes.get(name) == tuple(shape) for name, shape in input_shapes.items()):
                # The model's own shapes, all concrete, every spec laid out: compile time's inference is this call's.
                inference, placements = self.inference, self._placements
            else:
                inference = sharding.infer(proto, self.configuration, input_shapes=input_shapes)
                errors = inference.errors()
                if self.check and errors:
                    raise ShardingError(list(errors))
                layouts = spec_layouts(inference, strict=True)
                num_devices = self._mapping.plan.device_array().size
                mapping = map_specs(layouts, num_devices, self._mapping.plan)
                placements = placements_on(mapping, layouts, self.mesh)
            found = _Signature(
                inference, placements, output_placements(proto, placements), input_placements(proto, placements)
            )
        self._signatures[key] = found
        return found

    # -- tracing ----------------------------------------------------------

    def _evaluate(self, signature: _Signature, stored: tuple, inputs: Mapping[str, Any]) -> tuple:
        params, copies = stored
        views = {}
        for name, value in params.items():
            view = self._store.view(name, value)
            if view is not None:
                views[name] = view
        consumer_values = {}
        for key, copy in self._store.consumer_copy.items():
            consumer_values[key] = self._store.view(copy, copies[copy]) or self._store.logical(copy, copies[copy])
        if self.model.scan.active and signature.placements is not self._placements:
            why = layer_specs_differ(self.model.proto, self.model.scan, signature.placements, self.model.params)
            if why:
                raise NodeError(
                    f"at these input shapes the layers' specs differ ({why}), but the layers were compiled as one "
                    "lax.scan; compile with scan_layers=False"
                )
        hooks = ShardingHooks(signature.placements, views, consumer_values)
        return self.model.evaluate(self._logical_params(params), inputs, hooks)

    def _program(self, inputs: Sequence[Any], named: Mapping[str, Any]):
        """The jitted program for these inputs and its runtime arguments.

        Inputs that set shapes are folded in as constants (one program per
        value). An output whose spec does not divide its shape cannot come
        back sharded (JAX holds no unevenly sharded array): it comes back
        replicated, with a warning, once per input signature.
        """
        placed, static, key, shapes, signature = self._prepare(inputs, named)
        args = ((self.params, self.param_copies), placed)
        jitted = self._jitted.get((key, shapes))
        if jitted is None:
            evaluate = lambda stored, values: self._evaluate(signature, stored, {**values, **static})  # noqa: E731
            out_shardings = output_shardings(
                self.mesh, self.model.output_names, signature.out_placements, jax.eval_shape(evaluate, *args)
            )
            options = compiler_options(self.mesh.devices.flat[0].platform)
            jitted = self._jitted[(key, shapes)] = jax.jit(evaluate, out_shardings=out_shardings, compiler_options=options)
        return jitted, args, signature

    def _prepare(self, inputs: Sequence[Any], named: Mapping[str, Any]):
        """Binds a call's inputs: (runtime inputs placed on the mesh, shape-setting ones, their key, shapes, signature)."""
        dynamic, static, key = self.model.split_static(self.model.bind_inputs(inputs, named))
        dynamic = {k: auto_input(v) for k, v in dynamic.items()}
        shapes = tuple((k, np.shape(v)) for k, v in sorted(dynamic.items()))
        input_shapes = {k: tuple(np.shape(v)) for k, v in {**dynamic, **static}.items()}
        signature = self._signature((key, shapes), input_shapes)
        return place_on_mesh(dynamic, signature.in_placements, self.mesh), static, key, shapes, signature

    def place_inputs(self, **named: Any) -> dict[str, Any]:
        """The named inputs as a call places them (``placements.place_on_mesh``); shape-setting ones stay numpy.

        A segmented run (:mod:`onnx2jax.runtime.segmented`) places a host step's
        outputs with this before calling, so that it can report where they went.
        """
        with self._scope():
            placed, static, _, _, _ = self._prepare((), named)
        return {**placed, **static}

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the sharded program; returns jax.Arrays in ONNX output order.

        A repeated input signature takes the short path of
        :mod:`onnx2jax.runtime.fast_call`: the executable the first such call
        compiled, called directly.
        """
        self._last_args = (inputs, named)
        key = None if self.model.shape_input_names else call_key(inputs, named)
        fast = self._fast_calls.get(key)
        if fast is not None:
            return fast(inputs, named)
        with self._scope():
            jitted, args, _ = self._program(inputs, named)
            if key is None:
                return jitted(*args)
            executable = jitted.lower(*args).compile()  # the same compile: jit and lower() share their cache
            names = tuple(self.model.input_names[: len(inputs)])
            moves = moved_inputs({**dict(zip(names, inputs)), **named}, args[1])
            self._fast_calls[key] = FastCall(executable, args[0], names, moves, self.model.uses_64bit)
            return executable(*args)

    def _scope(self) -> contextlib.ExitStack:
        """64-bit types for this call only, and this program's mesh whatever mesh the caller set."""
        stack = contextlib.ExitStack()
        stack.enter_context(jax.enable_x64(self.model.uses_64bit or jax.config.jax_enable_x64))
        stack.enter_context(tracing(self.mesh))
        return stack

    def lower(self, *inputs: Any, **named: Any) -> jax.stages.Lowered:
        """The jax ``Lowered`` program for these inputs (``.as_text()``, ``.compile()``)."""
        with self._scope():
            jitted, args, _ = self._program(inputs, named)
            return jitted.lower(*args)

    def compiled_text(self, *inputs: Any, **named: Any) -> str:
        """The HLO text of the compiled, partitioned program."""
        with self._scope():
            jitted, args, _ = self._program(inputs, named)
            return jitted.lower(*args).compile().as_text()

    def report(self, *inputs: Any, **named: Any) -> "Report":
        """Per node specs, collectives of the compiled program and bytes per device.

        Uses the given inputs, else those of the last call.

        Raises:
          ValueError: no inputs given and the model was never called.
        """
        inputs, named = example_inputs(inputs, named, self._last_args)
        with self._scope():
            jitted, args, signature = self._program(inputs, named)
            compiled = jitted.lower(*args).compile()
        text = compiled.as_text()
        memory = compiled.memory_analysis()
        return Report(
            mesh=dict(self.mesh.shape),
            configuration=self.configuration,
            collectives=count_collectives(text),
            param_bytes_per_device=param_bytes_per_device(self.stored_params),
            param_bytes_total=sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in self.model.params.values()),
            temp_bytes=getattr(memory, "temp_size_in_bytes", None),
            node_specs=node_rows(signature.inference, signature.placements),
            notes=self._notes() + loop_note(self.model, text),
        )

    def _notes(self) -> list[str]:
        notes = [self.model.layers_report()]
        if self._mapping is not None:
            for key, extra in self._mapping.partial.items():
                notes.append(
                    f"{key}: the spec names only some devices; inside one SPMD "
                    f"program devices {sorted(extra)} hold replicas"
                )
        return notes + self._store.notes()


def _choose_configuration(proto: onnx.ModelProto, configuration: str | None) -> str | None:
    configs = device_configurations(proto)
    if configuration is not None:
        if configuration not in configs:
            raise ValueError(f"configuration {configuration!r} not in the model; it has {sorted(configs)}")
        return configuration
    if not configs:
        return None
    if len(configs) > 1:
        raise ValueError(f"the model has several device configurations {sorted(configs)}; pass configuration=")
    return next(iter(configs))


def compile(  # noqa: A001 - the name mirrors jax's compile step on purpose
    model: ModelLike,
    mesh: Mesh | None = None,
    *,
    configuration: str | None = None,
    check: bool = True,
    devices: Sequence[int] | None = None,
    microbatches: int = 1,
    scan_layers: ScanSetting = "auto",
) -> "Compiled | PipelineCompiled | SegmentedCompiled":
    """Compiles an annotated ONNX model for a device mesh.

    Args:
      model: a path, bytes or ModelProto carrying sharding annotations (or none:
        then it runs replicated).
      mesh: the jax Mesh to run on, with Explicit or Auto axes (the program
        runs on its devices and axis names with Auto axes: see
        :mod:`onnx2jax.runtime.user_mesh`). When None, the mesh of an enclosing
        ``with jax.set_mesh(mesh):``; outside one, a mesh is built from the
        model's device configuration over ``jax.devices()`` (configuration
        device i is ``jax.devices()[i]``), with axes chosen so that every spec
        is a NamedSharding on it.
      configuration: which DeviceConfigurationProto to use, when there are several.
      check: refuse a model whose annotations break an op's sharding rule
        (``sharding.infer``'s errors). Malformed annotations (axes, sizes,
        devices, configurations, node names, stages: ``sharding.validate``)
        are refused whatever ``check`` says, before anything is traced.
      devices: with a user ``mesh``, the flat mesh position of each configuration
        device (default: row-major, device i at position i).
      microbatches: for a model with pipeline stages (``pipeline_stage``), the
        number of micro-batches a call's batch is split into; such a model
        compiles to a :class:`onnx2jax.runtime.pipeline.PipelineCompiled`.
      scan_layers: as :func:`onnx2jax.translate`'s: run the repeated layers
        as one ``lax.scan``, each stacked parameter placed with its first
        layer's spec behind an unsplit layer axis. Layers whose specs differ
        stay unrolled (``report().notes`` says why; ``True`` raises instead).

    Returns:
      A :class:`Compiled`: call it like the model. A model whose output
      shapes depend on run-time values (NonMaxSuppression, NonZero, ...:
      ``onnx2jax.translate(model).segments``) gives a
      :class:`onnx2jax.runtime.segmented.SegmentedCompiled`, which runs each jitted
      segment sharded and the data-dependent nodes on the host between them.

    Raises:
      sharding.ShardingError: the annotations have errors (each diagnostic
        names the node, tensor and axis); at a call, a size written on a
        symbolic axis that the call's shapes contradict.
      onnx2jax.errors.ModelLoadError: the file cannot be read safely.
      sharding.mesh.layout.MeshMappingError: a spec cannot be a NamedSharding on one mesh.

    Example:
      >>> compiled = onnx2jax.compile("llama_tp8.onnx")          # doctest: +SKIP
      >>> (logits,) = compiled(input_ids)                         # doctest: +SKIP
      >>> compiled.report().render()                              # doctest: +SKIP
    """
    proto, external_dir = open_model(model)
    structural = require_valid(proto, strict=True)
    mesh = auto_axes(context_mesh() if mesh is None else mesh)
    config = _choose_configuration(proto, configuration)
    if config is not None and has_stages(proto, config):
        from onnx2jax.runtime.pipeline import compile_pipeline  # it builds on this module

        return compile_pipeline(
            proto, external_dir, config, mesh, microbatches=microbatches, check=check, structural=structural,
            scan_layers=scan_layers,
        )
    if microbatches != 1:
        raise ValueError(f"microbatches={microbatches} needs a model with pipeline stages; this one has none")
    return compile_proto(
        proto, external_dir, mesh, configuration=config, check=check, devices=devices, structural=structural,
        scan_layers=scan_layers,
    )


def compile_proto(
    proto: onnx.ModelProto,
    external_dir: str | None,
    mesh: Mesh | None = None,
    *,
    configuration: str | None = None,
    check: bool = True,
    devices: Sequence[int] | None = None,
    jax_devices: Sequence[jax.Device] | None = None,
    structural: Sequence[Diagnostic] = (),
    scan_layers: ScanSetting = "auto",
) -> "Compiled | SegmentedCompiled":
    """The SPMD compile of an opened model (see :func:`compile`).

    A model cut around data-dependent nodes (``JaxModel.segments``) compiles
    to a :class:`onnx2jax.runtime.segmented.SegmentedCompiled`: one SPMD program per
    jitted segment on one mesh, host steps between them.

    Args:
      jax_devices: without a ``mesh``, the jax device each configuration
        device runs on (default ``jax.devices()``); a pipeline stage passes
        its sub-mesh's devices.
      structural: what ``sharding.validate`` found (notes of sizes to check
        at each call).
    """
    jax_model = JaxModel(proto, external_dir, scan_layers=scan_layers)
    config = _choose_configuration(proto, configuration)
    if jax_model.segments:
        from onnx2jax.runtime.segmented import compile_segmented  # it builds on this module

        return compile_segmented(
            jax_model, external_dir, mesh, configuration=config, check=check, devices=devices,
            jax_devices=jax_devices, structural=structural,
        )
    if config is None:
        mesh = mesh or Mesh(np.array(jax.devices()[:1]), ("d0",))
        return Compiled(jax_model, mesh, None, {}, None, None)
    num_devices = device_configurations(proto)[config].num_devices
    inference = sharding.infer(proto, config)
    errors = inference.errors()
    if check and errors:
        raise ShardingError(list(errors))
    # At the model's own shapes: a fused spec on a symbolic axis waits for the call's shapes.
    layouts = spec_layouts(inference, strict=False)
    mesh, mapping = mesh_for(layouts, config, num_devices, mesh, devices, jax_devices)
    placements = placements_on(mapping, layouts, mesh)
    return Compiled(jax_model, mesh, inference, placements, mapping, config, check=check, structural=structural)
