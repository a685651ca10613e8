"""``onnx2jax.compile(model, mesh)``: sharded execution through XLA's SPMD partitioner.

The steps, in order:

1. load and translate the model (:mod:`onnx2jax.translate`);
2. check its annotations and complete them (:func:`sharding.infer`): every
   node input and output on the sharded path gets a spec;
3. map every spec onto one jax ``Mesh`` (:mod:`onnx2jax.mesh`), or use the
   mesh the caller gives;
4. place the initializers sharded, each device receiving only its slice, once
   per distinct layout their consumers ask for (:mod:`onnx2jax.parameters`);
5. per input shape signature of a call: infer again at those concrete shapes
   (a Reshape that fuses a sharded axis with a symbolic one needs them), map
   the specs onto the mesh, trace the graph with ``with_sharding_constraint``
   on every node input and output that has a spec, and jit it; XLA inserts
   the collectives.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import warnings
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import sharding
from onnx2jax.constraints import Placement, ShardingHooks, SpecKey
from onnx2jax.fast_call import FastCall, call_key, moved_inputs
from onnx2jax.loading import ModelLike, open_model
from onnx2jax.errors import DeviceCountError
from onnx2jax.mesh import Layout, MeshMapping, MeshPlan, layout_of, map_specs
from onnx2jax.parameters import ParameterStore, holdable_sharding, padded_shape
from onnx2jax.errors import NodeError
from onnx2jax.scan import ScanSetting, per_layer_names
from onnx2jax.scan_sharded import layer_specs_differ, loop_collectives, place_stacked
from onnx2jax.sizes_at_call import SizesAtCall
from onnx2jax.translate import JaxModel
from onnx2jax.user_mesh import auto_axes, auto_input, context_mesh, tracing
from onnx2jax.xla_options import compiler_options
from sharding.diagnostics import Diagnostic, ShardingError
from sharding.spec import device_configurations
from sharding.stages import has_stages
from sharding.text import format_spec
from sharding.validate import require_valid

if TYPE_CHECKING:
    from onnx2jax.pipeline import PipelineCompiled
    from onnx2jax.segmented import SegmentedCompiled

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def _concrete(shape: tuple) -> tuple[int, ...]:
    """Sizes for layout purposes; unknown dims only matter for fused axes, which carry their sizes."""
    return tuple(d if isinstance(d, int) else 0 for d in shape)


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
        # axes are checked as they are laid out per call, in _layouts).
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
                layouts = _layouts(inference, strict=True)
                num_devices = self._mapping.plan.device_array().size
                mapping = map_specs(layouts, num_devices, self._mapping.plan)
                placements = _placements(mapping, layouts, self.mesh)
            found = _Signature(
                inference, placements, _output_placements(proto, placements), _input_placements(proto, placements)
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
            out_shardings = self._output_shardings(signature.out_placements, jax.eval_shape(evaluate, *args))
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
        return self._place_inputs(dynamic, signature), static, key, shapes, signature

    def place_inputs(self, **named: Any) -> dict[str, Any]:
        """The named inputs as a call places them (see ``_place_inputs``); shape-setting ones stay numpy.

        A segmented run (:mod:`onnx2jax.segmented`) places a host step's
        outputs with this before calling, so that it can report where they went.
        """
        with self._scope():
            placed, static, _, _, _ = self._prepare((), named)
        return {**placed, **static}

    def _place_inputs(self, values: Mapping[str, Any], signature: _Signature) -> dict[str, Any]:
        """Every runtime input as a jax.Array on the mesh, so that XLA never picks an input layout.

        A jax.Array already on the mesh's devices is used as it is. Anything
        else is placed with its first reader's spec when JAX can hold it
        (each device receives only its slice), else replicated; the reader's
        constraint then reshards inside the program. (Left to XLA, an input
        whose spec does not divide its shape got an uneven layout that jax
        then refused with IndivisibleError.)
        """
        mesh_devices = set(self.mesh.devices.flat)
        replicated = NamedSharding(self.mesh, PartitionSpec())
        placed = {}
        for name, value in values.items():
            if isinstance(value, jax.core.Tracer) or (
                isinstance(value, jax.Array) and value.sharding.device_set == mesh_devices
            ):
                placed[name] = value
                continue
            placement = signature.in_placements.get(name)
            target = replicated
            if placement is not None and not placement.fused:
                target = holdable_sharding(tuple(np.shape(value)), placement.sharding)
            placed[name] = jax.device_put(value, target)
        return placed

    def _output_shardings(self, wanted: tuple, outputs: Sequence[jax.ShapeDtypeStruct]) -> tuple:
        """The sharding each output comes back with: never left to XLA.

        An output whose producer has a spec comes back in it; one without a
        spec comes back replicated on the mesh. A spec JAX cannot hold (its
        sharded axes do not divide the shape, or it fuses an axis, which is
        not a tile of the ONNX tensor) comes back replicated, with a warning
        naming the output.
        """
        replicated = NamedSharding(self.mesh, PartitionSpec())
        shardings = []
        for name, placement, output in zip(self.model.output_names, wanted, outputs):
            why = None
            if placement is None:
                named = replicated
            elif placement.fused:
                why = "its sharding spec fuses an axis, so its shards are not tiles of the ONNX tensor"
            elif padded_shape(output.shape, placement.sharding) != tuple(output.shape):
                why = "its sharding spec does not divide its shape evenly, and JAX cannot hold an unevenly sharded array"
            else:
                named = placement.sharding
            if why is not None:
                warnings.warn(f"output {name!r} {list(output.shape)}: {why}, so it comes back replicated", stacklevel=4)
                named = replicated
            shardings.append(named)
        return tuple(shardings)

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the sharded program; returns jax.Arrays in ONNX output order.

        A repeated input signature takes the short path of
        :mod:`onnx2jax.fast_call`: the executable the first such call
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
            node_specs=_node_rows(signature),
            notes=self._notes() + _loop_note(self.model, text),
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


def _node_rows(signature: _Signature) -> list[tuple[str, str, str, str, str]]:
    """Per node input and output with a spec: node, tensor, spec, given/inferred, PartitionSpec."""
    rows = []
    if signature.inference is None:
        return rows
    for name, node in signature.inference.nodes.items():
        for kind, specs, given in (("in", node.inputs, node.given_inputs), ("out", node.outputs, node.given_outputs)):
            for position, spec in enumerate(specs):
                if spec is None:
                    continue
                placement = signature.placements.get(SpecKey(name, kind, position, spec.tensor_name))
                pspec = str(placement.sharding.spec) if placement else "-"
                origin = "given" if given[position] else "inferred"
                rows.append((f"{name} ({node.op_type})", f"{kind} {spec.tensor_name}", _short(format_spec(spec)), origin, pspec))
    return rows


def _loop_note(model: JaxModel, text: str) -> list[str]:
    """For scanned layers: the collectives a call runs, the loop's body counted once per layer."""
    split = loop_collectives(text, count_collectives) if model.scan.active else None
    if split is None:
        return []
    outside, inside, trip = split
    body = ", ".join(f"{k} {v}" for k, v in inside.items() if v) or "no collectives"
    total = ", ".join(f"{k} {outside[k] + trip * v}" for k, v in inside.items() if outside[k] + trip * v) or "none"
    return [
        f"the collectives above are the program text's: the while loop's body (one layer) holds {body} "
        f"and runs {trip} times, so a call runs {total}"
    ]


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Counts collective instructions in compiled HLO text (async start/done pairs count once)."""
    counts = {}
    for kind in _COLLECTIVES:
        pattern = re.compile(rf"=\s*[^=\n]*?\b{kind}(?:-start)?\(")
        counts[kind] = len(pattern.findall(hlo_text))
    return counts


def param_bytes_per_device(params: Mapping[str, jax.Array]) -> dict[int, int]:
    """Bytes of parameters each device holds, by device id."""
    per_device: dict[int, int] = {}
    for array in params.values():
        for shard in array.addressable_shards:
            per_device[shard.device.id] = per_device.get(shard.device.id, 0) + shard.data.nbytes
    return per_device


@dataclasses.dataclass
class Report:
    """What :meth:`Compiled.report` measured."""

    mesh: dict[str, int]
    configuration: str | None
    collectives: dict[str, int]
    param_bytes_per_device: dict[int, int]
    param_bytes_total: int
    temp_bytes: int | None
    node_specs: list[tuple[str, str, str, str, str]]
    notes: list[str]

    def render(self, console=None, *, every_spec: bool = False) -> None:
        """Prints the report as tables (rich).

        Args:
          every_spec: list inferred specs too, not only the ones written in the model.
        """
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        rows = [r for r in self.node_specs if every_spec or r[3] == "given"]
        inferred = sum(1 for r in self.node_specs if r[3] == "inferred")
        title = "sharding specs" + ("" if every_spec else f" written in the model (+{inferred} inferred, not shown)")
        table = Table(title=title, box=None, pad_edge=False)
        for column in ("node", "tensor", "spec", "from", "PartitionSpec"):
            table.add_column(column, overflow="fold")  # at 80 columns a long name folds, nothing is cut
        for row in rows:
            table.add_row(*row)
        console.print(table)
        console.print(f"mesh {self.mesh}  configuration {self.configuration!r}")
        console.print("collectives: " + ", ".join(f"{k} {v}" for k, v in self.collectives.items()))
        per_device = sorted(self.param_bytes_per_device.values())
        if per_device:
            console.print(
                f"parameter bytes per device: {per_device[-1]:,} (max) / {per_device[0]:,} (min); "
                f"unsharded total {self.param_bytes_total:,}"
            )
        for note in self.notes:
            console.print(f"note: {note}")


def _short(text: str) -> str:
    """Spec text with runs of consecutive devices written as ranges: [0,1,2,3] -> [0..3]."""

    def compact(match: re.Match) -> str:
        numbers = [int(n) for n in match.group(1).split(",")]
        if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{match.group(0)[0]}{numbers[0]}..{numbers[-1]}{match.group(0)[-1]}"
        return match.group(0)

    return re.sub(r"[\[{]([0-9]+(?:,[0-9]+)+)[\]}]", compact, text)


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


def example_inputs(
    inputs: Sequence[Any], named: Mapping[str, Any], last: tuple | None
) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """The inputs a ``report()`` measures with: those given, else ``last`` (the last call's).

    Raises:
      ValueError: none given and the model was never called.
    """
    if inputs or named:
        return inputs, named
    if last is None:
        raise ValueError("report() needs example inputs, or call the model once first")
    return last


def _plan_for_mesh(mesh: Mesh, num_devices: int, device_ids: Sequence[int] | None, configuration: str | None) -> MeshPlan:
    """Configuration device i sits at flat mesh position ``device_ids[i]`` (row-major by default)."""
    if mesh.devices.size != num_devices:
        raise DeviceCountError(
            configuration, num_devices, mesh.devices.size, mesh=True, hint=len(jax.devices()) < num_devices
        )
    positions = list(range(num_devices)) if device_ids is None else list(device_ids)
    if sorted(positions) != list(range(num_devices)):
        raise ValueError(f"devices= must be a permutation of range({num_devices}), got {positions}")
    order = [0] * num_devices
    for config_device, position in enumerate(positions):
        order[position] = config_device
    return MeshPlan(tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(order))


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
        :mod:`onnx2jax.user_mesh`). When None, the mesh of an enclosing
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
        compiles to a :class:`onnx2jax.pipeline.PipelineCompiled`.
      scan_layers: as :func:`onnx2jax.translate`'s: run the repeated layers
        as one ``lax.scan``, each stacked parameter placed with its first
        layer's spec behind an unsplit layer axis. Layers whose specs differ
        stay unrolled (``report().notes`` says why; ``True`` raises instead).

    Returns:
      A :class:`Compiled`: call it like the model. A model whose output
      shapes depend on run-time values (NonMaxSuppression, NonZero, ...:
      ``onnx2jax.translate(model).segments``) gives a
      :class:`onnx2jax.segmented.SegmentedCompiled`, which runs each jitted
      segment sharded and the data-dependent nodes on the host between them.

    Raises:
      sharding.ShardingError: the annotations have errors (each diagnostic
        names the node, tensor and axis); at a call, a size written on a
        symbolic axis that the call's shapes contradict.
      onnx2jax.errors.ModelLoadError: the file cannot be read safely.
      onnx2jax.mesh.MeshMappingError: a spec cannot be a NamedSharding on one mesh.

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
        from onnx2jax.pipeline import compile_pipeline  # it builds on this module

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
    to a :class:`onnx2jax.segmented.SegmentedCompiled`: one SPMD program per
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
        from onnx2jax.segmented import compile_segmented  # it builds on this module

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
    layouts = _layouts(inference, strict=False)
    mesh, mapping = mesh_for(layouts, config, num_devices, mesh, devices, jax_devices)
    placements = _placements(mapping, layouts, mesh)
    return Compiled(jax_model, mesh, inference, placements, mapping, config, check=check, structural=structural)


def mesh_for(
    layouts: Mapping[SpecKey, Layout],
    config: str,
    num_devices: int,
    mesh: Mesh | None,
    devices: Sequence[int] | None,
    jax_devices: Sequence[jax.Device] | None,
) -> tuple[Mesh, MeshMapping]:
    """The mesh the specs run on (the user's, or one searched from the layouts) and the specs mapped onto it."""
    if mesh is not None:
        return mesh, map_specs(layouts, num_devices, _plan_for_mesh(mesh, num_devices, devices, config))
    jax_devices = list(jax_devices) if jax_devices is not None else jax.devices()
    if len(jax_devices) < num_devices:
        raise DeviceCountError(config, num_devices, len(jax_devices))
    mapping = map_specs(layouts, num_devices)
    array = np.array([jax_devices[d] for d in mapping.plan.device_order]).reshape(mapping.plan.axis_sizes)
    return Mesh(array, mapping.plan.axis_names), mapping


def _layouts(inference: "sharding.Inference", *, strict: bool) -> dict[SpecKey, Layout]:
    """The layout of every spec of ``inference`` at its shapes.

    Args:
      strict: the shapes are a call's: every fused axis must have its size.
        Otherwise (the model's own shapes) a spec that fuses an axis of
        unknown size is left out, to be laid out per call.

    Raises:
      ShardingError: a spec has no shape, or its fused sub-axis sizes do not
        match the axis (naming node, tensor and axis).
    """
    layouts: dict[SpecKey, Layout] = {}
    for name, node in inference.nodes.items():
        for kind, values in (("in", node.inputs), ("out", node.outputs)):
            for position, spec in enumerate(values):
                if spec is None:
                    continue
                shape = inference.shapes.get(spec.tensor_name)
                if shape is None:
                    raise ShardingError([_unknown_shape(name, node.op_type, spec.tensor_name)])
                fused_unknown = [
                    d.axis for d in spec.sharded_dims if len(d.parts) > 1 and not isinstance(shape[d.axis], int)
                ]
                if fused_unknown and not strict:
                    continue
                if fused_unknown:
                    why = f"fused axis {fused_unknown[0]}: its size is not known even at the call's shapes"
                    raise ShardingError([_fused_axis_error(name, node.op_type, spec.tensor_name, fused_unknown[0], why)])
                try:
                    layouts[SpecKey(name, kind, position, spec.tensor_name)] = layout_of(spec, _concrete(shape))
                except ValueError as e:
                    axis = next((d.axis for d in spec.sharded_dims if len(d.parts) > 1), None)
                    raise ShardingError([_fused_axis_error(name, node.op_type, spec.tensor_name, axis, str(e))]) from e
    return layouts


def _placements(mapping: MeshMapping, layouts: Mapping[SpecKey, Layout], mesh: Mesh) -> dict[SpecKey, Placement]:
    return {
        key: Placement(NamedSharding(mesh, PartitionSpec(*pspec)), layouts[key].fused)
        for key, pspec in mapping.pspecs.items()
    }


def _output_placements(proto: onnx.ModelProto, placements: Mapping[SpecKey, Placement]) -> tuple:
    """Each graph output's placement from its producer's spec (None: no spec)."""
    produced: dict[str, Placement] = {}
    for node in proto.graph.node:
        for position, name in enumerate(node.output):
            placement = placements.get(SpecKey(node.name, "out", position, name))
            if placement is not None:
                produced[name] = placement
    shardings = []
    for output in proto.graph.output:
        placement = produced.get(output.name)
        shardings.append(placement)
    return tuple(shardings)


def _input_placements(proto: onnx.ModelProto, placements: Mapping[SpecKey, Placement]) -> dict[str, Placement]:
    """Each graph input's placement from the first node input that reads it with a spec."""
    names = {i.name for i in proto.graph.input}
    found: dict[str, Placement] = {}
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            placement = placements.get(SpecKey(node.name, "in", position, name))
            if name in names and name not in found and placement is not None:
                found[name] = placement
    return found


def _fused_axis_error(node: str, op_type: str, tensor: str, axis: int | None, why: str) -> Diagnostic:
    return Diagnostic(
        code="fused-axis-size",
        severity="error",
        node=node,
        op_type=op_type,
        tensor=tensor,
        axis=axis,
        message=f"the spec's sub-axes cannot be laid out at the call's shapes ({why})",
        hint="write sub-axis sizes (dim_value) whose product is the axis size at the shapes the model is called with",
    )


def _unknown_shape(node: str, op_type: str, tensor: str) -> Diagnostic:
    return Diagnostic(
        code="unknown-shape",
        severity="error",
        node=node,
        op_type=op_type,
        tensor=tensor,
        message="the tensor has a sharding spec but ONNX shape inference gives it no shape",
        hint="add value_info with the tensor's shape to the model",
    )
