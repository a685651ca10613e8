"""``onnx2jax.compile(model, mesh)``: sharded execution through XLA's SPMD partitioner.

The steps, in order:

1. load and translate the model (:mod:`onnx2jax.translate`);
2. check its annotations and complete them (:func:`sharding.infer`): every
   node input and output on the sharded path gets a spec;
3. map every spec onto one jax ``Mesh`` (:mod:`onnx2jax.mesh`), or use the
   mesh the caller gives;
4. place the initializers sharded, each device receiving only its slice;
5. trace the graph with ``with_sharding_constraint`` on every node input and
   output that has a spec, and jit it; XLA inserts the collectives.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import sharding
from onnx2jax.constraints import Placement, ShardingHooks, SpecKey, View
from onnx2jax.loading import ModelLike, open_model
from onnx2jax.mesh import Layout, MeshMapping, MeshPlan, layout_of, map_specs
from onnx2jax.translate import JaxModel
from sharding.diagnostics import Diagnostic, ShardingError
from sharding.infer import tensor_shapes
from sharding.spec import device_configurations
from sharding.text import format_spec

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


@dataclasses.dataclass(frozen=True)
class _ParamLayout:
    """A parameter stored in another shape than ONNX's.

    JAX holds a fused-axis parameter sharded only in its unfused shape, and an
    array whose sharded axes do not divide evenly not at all: such a parameter
    is stored unfused and zero-padded, and sliced and reshaped back when used.
    """

    logical_shape: tuple[int, ...]
    unfused_shape: tuple[int, ...]
    padded_shape: tuple[int, ...]


def _concrete(shape: tuple) -> tuple[int, ...]:
    """Sizes for layout purposes; unknown dims only matter for fused axes, which carry their sizes."""
    return tuple(d if isinstance(d, int) else 0 for d in shape)


class Compiled:
    """A model compiled for a mesh. Call it like the model; see :func:`compile`.

    Attributes:
      model: the translated :class:`~onnx2jax.translate.JaxModel`.
      mesh: the jax Mesh every sharding lives on.
      inference: the completed annotations (None for an unannotated model).
      params: the initializers as jax.Arrays, placed with their shardings.
        A parameter with a fused-axis spec is held in its unfused shape (for
        example a [H, 2F] gate/up weight as [H, 2, F]); one whose sharded axes
        do not divide evenly is held zero-padded. ``logical_params`` gives the
        ONNX shapes back.
    """

    def __init__(
        self,
        model: JaxModel,
        mesh: Mesh,
        inference: "sharding.Inference | None",
        placements: dict[SpecKey, Placement],
        tensor_placements: dict[str, Placement],
        mapping: MeshMapping | None,
        configuration: str | None,
    ):
        self.model = model
        self.mesh = mesh
        self.inference = inference
        self.configuration = configuration
        self._placements = placements
        self._tensor_placements = tensor_placements
        self._mapping = mapping
        self._param_layouts: dict[str, _ParamLayout] = {}
        self.params = self._place_params(tensor_placements)
        self._out_shardings = self._output_shardings(tensor_placements)
        self._jitted: dict[tuple, Any] = {}
        self._last_args: tuple | None = None

    # -- parameters -------------------------------------------------------

    def _place_params(self, tensor_placements: dict[str, Placement]) -> dict[str, jax.Array]:
        """Puts each parameter on the mesh; each device receives only its own slice from the host."""
        replicated = NamedSharding(self.mesh, PartitionSpec())
        placed = {}
        for name, array in self.model.params.items():
            placement = tensor_placements.get(name)
            if placement is None:
                placed[name] = jax.device_put(array, replicated)
                continue
            unfused = array.reshape(placement.expand(array.shape))
            padded = _padded_shape(unfused.shape, placement.sharding)
            if placement.fused or padded != unfused.shape:
                self._param_layouts[name] = _ParamLayout(array.shape, unfused.shape, padded)
            host = np.pad(unfused, [(0, p - s) for p, s in zip(padded, unfused.shape)]) if padded != unfused.shape else unfused
            placed[name] = jax.device_put(host, placement.sharding)
        return placed

    def _logical_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(params)
        for name, layout in self._param_layouts.items():
            value = params[name]
            if layout.padded_shape != layout.unfused_shape:
                value = value[tuple(slice(0, s) for s in layout.unfused_shape)]
            out[name] = value.reshape(layout.logical_shape)
        return out

    @property
    def logical_params(self) -> dict[str, jax.Array]:
        """The parameters in their ONNX shapes (fused views folded, padding removed)."""
        return self._logical_params(self.params)

    # -- outputs ----------------------------------------------------------

    def _output_shardings(self, tensor_placements: dict[str, Placement]) -> tuple:
        shardings = []
        for name in self.model.output_names:
            placement = tensor_placements.get(name)
            if placement is None or placement.fused:
                shardings.append(None)
            else:
                shardings.append(placement.sharding)
        return tuple(shardings)

    # -- tracing ----------------------------------------------------------

    def _evaluate(self, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> tuple:
        views = {}
        for name, layout in self._param_layouts.items():
            placement = self._tensor_placements[name]
            if len(placement.fused) == 1:
                ((axis, sizes),) = placement.fused
                stored = params[name][tuple(slice(0, s) for s in layout.unfused_shape)]
                views[name] = View(stored, layout.logical_shape, axis, len(sizes))
        hooks = ShardingHooks(self._placements, views)
        return self.model.evaluate(self._logical_params(params), inputs, hooks)

    def _program(self, inputs: Sequence[Any], named: Mapping[str, Any]):
        """The jitted program for these inputs and its runtime arguments.

        Inputs that set shapes are folded in as constants (one program per
        value). An output whose spec does not divide its shape cannot come
        back sharded (JAX holds no unevenly sharded array): it comes back
        replicated, with a warning, once per input signature.
        """
        dynamic, static, key = self.model.split_static(self.model.bind_inputs(inputs, named))
        args = (self.params, dynamic)
        shapes = tuple((k, np.shape(v)) for k, v in sorted(dynamic.items()))
        jitted = self._jitted.get((key, shapes))
        if jitted is None:
            evaluate = lambda params, values: self._evaluate(params, {**values, **static})  # noqa: E731
            out_shardings = self._even_out_shardings(jax.eval_shape(evaluate, *args))
            jitted = self._jitted[(key, shapes)] = jax.jit(evaluate, out_shardings=out_shardings)
        return jitted, args

    def _even_out_shardings(self, outputs: Sequence[jax.ShapeDtypeStruct]) -> tuple:
        shardings = []
        for name, named, output in zip(self.model.output_names, self._out_shardings, outputs):
            if named is not None and _padded_shape(output.shape, named) != tuple(output.shape):
                warnings.warn(
                    f"output {name!r} {list(output.shape)}: its sharding spec does not divide its shape "
                    "evenly, and JAX cannot hold an unevenly sharded array, so it comes back replicated",
                    stacklevel=4,
                )
                named = None
            shardings.append(named)
        return tuple(shardings)

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the sharded program; returns jax.Arrays in ONNX output order."""
        with jax.enable_x64(self.model.uses_64bit or jax.config.jax_enable_x64):
            self._last_args = (inputs, named)
            jitted, args = self._program(inputs, named)
            return jitted(*args)

    def lower(self, *inputs: Any, **named: Any) -> jax.stages.Lowered:
        """The jax ``Lowered`` program for these inputs (``.as_text()``, ``.compile()``)."""
        with jax.enable_x64(self.model.uses_64bit or jax.config.jax_enable_x64):
            jitted, args = self._program(inputs, named)
            return jitted.lower(*args)

    def compiled_text(self, *inputs: Any, **named: Any) -> str:
        """The HLO text of the compiled, partitioned program."""
        with jax.enable_x64(self.model.uses_64bit or jax.config.jax_enable_x64):
            jitted, args = self._program(inputs, named)
            return jitted.lower(*args).compile().as_text()

    def report(self, *inputs: Any, **named: Any) -> "Report":
        """Per node specs, collectives of the compiled program and bytes per device.

        Uses the given inputs, else those of the last call.

        Raises:
          ValueError: no inputs given and the model was never called.
        """
        if not inputs and not named:
            if self._last_args is None:
                raise ValueError("report() needs example inputs, or call the model once first")
            inputs, named = self._last_args
        compiled = self.lower(*inputs, **named).compile()
        text = compiled.as_text()
        memory = compiled.memory_analysis()
        return Report(
            mesh=dict(self.mesh.shape),
            configuration=self.configuration,
            collectives=count_collectives(text),
            param_bytes_per_device=param_bytes_per_device(self.params),
            param_bytes_total=sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in self.model.params.values()),
            temp_bytes=getattr(memory, "temp_size_in_bytes", None),
            node_specs=self._node_rows(),
            notes=self._notes(),
        )

    def _node_rows(self) -> list[tuple[str, str, str, str, str]]:
        rows = []
        if self.inference is None:
            return rows
        for name, node in self.inference.nodes.items():
            for kind, specs, given in (("in", node.inputs, node.given_inputs), ("out", node.outputs, node.given_outputs)):
                for position, spec in enumerate(specs):
                    if spec is None:
                        continue
                    placement = self._placements.get(SpecKey(name, kind, position, spec.tensor_name))
                    pspec = str(placement.sharding.spec) if placement else "-"
                    origin = "given" if given[position] else "inferred"
                    rows.append((f"{name} ({node.op_type})", f"{kind} {spec.tensor_name}", _short(format_spec(spec)), origin, pspec))
        return rows

    def _notes(self) -> list[str]:
        notes = []
        if self._mapping is not None:
            for key, extra in self._mapping.partial.items():
                notes.append(
                    f"{key}: the spec names only some devices; inside one SPMD "
                    f"program devices {sorted(extra)} hold replicas"
                )
        for name, layout in self._param_layouts.items():
            notes.append(
                f"parameter {name!r} {list(layout.logical_shape)} is stored as {list(layout.padded_shape)} "
                "(unfused and/or padded to divide evenly; see Compiled.params)"
            )
        return notes


def _padded_shape(shape: tuple[int, ...], named: NamedSharding) -> tuple[int, ...]:
    """``shape`` rounded up so that every sharded axis divides evenly (the GSPMD ceil rule)."""
    mesh_sizes = dict(named.mesh.shape)
    padded = []
    for size, entry in zip(shape, tuple(named.spec) + (None,) * (len(shape) - len(named.spec))):
        axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        n = math.prod(mesh_sizes[a] for a in axes)
        padded.append(-(-size // n) * n if n > 1 else size)
    return tuple(padded)


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
            table.add_column(column, no_wrap=True)
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


def _plan_for_mesh(mesh: Mesh, num_devices: int, device_ids: Sequence[int] | None) -> MeshPlan:
    """Configuration device i sits at flat mesh position ``device_ids[i]`` (row-major by default)."""
    if mesh.devices.size != num_devices:
        raise ValueError(
            f"the mesh has {mesh.devices.size} devices but the configuration has {num_devices}"
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
) -> Compiled:
    """Compiles an annotated ONNX model for a device mesh.

    Args:
      model: a path, bytes or ModelProto carrying sharding annotations (or none:
        then it runs replicated).
      mesh: the jax Mesh to run on. When None, one is built from the model's
        device configuration over ``jax.devices()`` (configuration device i is
        ``jax.devices()[i]``), with axes chosen so that every spec is a
        NamedSharding on it.
      configuration: which DeviceConfigurationProto to use, when there are several.
      check: run the sharding checker first and refuse a model with errors.
      devices: with a user ``mesh``, the flat mesh position of each configuration
        device (default: row-major, device i at position i).

    Returns:
      A :class:`Compiled`: call it like the model.

    Raises:
      sharding.ShardingError: the annotations have errors (each diagnostic
        names the node, tensor and axis).
      onnx2jax.mesh.MeshMappingError: a spec cannot be a NamedSharding on one mesh.

    Example:
      >>> compiled = onnx2jax.compile("llama_tp8.onnx")          # doctest: +SKIP
      >>> (logits,) = compiled(input_ids)                         # doctest: +SKIP
      >>> compiled.report().render()                              # doctest: +SKIP
    """
    proto, external_dir = open_model(model)
    jax_model = JaxModel(proto, external_dir)
    config = _choose_configuration(proto, configuration)
    if config is None:
        mesh = mesh or Mesh(np.array(jax.devices()[:1]), ("d0",))
        return Compiled(jax_model, mesh, None, {}, {}, None, None)
    num_devices = device_configurations(proto)[config].num_devices
    inference = sharding.infer(proto, config)
    errors = [d for d in inference.diagnostics if d.severity == "error"]
    if check and errors:
        raise ShardingError(list(errors))
    shapes, _ = tensor_shapes(proto)  # diagnostics of failed inference are already in inference
    layouts: dict[SpecKey, Layout] = {}
    for name, node in inference.nodes.items():
        for kind, values in (("in", node.inputs), ("out", node.outputs)):
            for position, spec in enumerate(values):
                if spec is None:
                    continue
                shape = shapes.get(spec.tensor_name)
                if shape is None:
                    raise ShardingError([_unknown_shape(name, node.op_type, spec.tensor_name)])
                layouts[SpecKey(name, kind, position, spec.tensor_name)] = layout_of(spec, _concrete(shape))
    if mesh is None:
        if len(jax.devices()) < num_devices:
            raise ValueError(
                f"configuration {config!r} needs {num_devices} devices, jax has {len(jax.devices())} "
                "(on CPU: jax.config.update('jax_num_cpu_devices', N) before jax starts)"
            )
        mapping = map_specs(layouts, num_devices)
        jax_devices = jax.devices()
        array = np.array([jax_devices[d] for d in mapping.plan.device_order]).reshape(mapping.plan.axis_sizes)
        mesh = Mesh(array, mapping.plan.axis_names)
    else:
        mapping = map_specs(layouts, num_devices, _plan_for_mesh(mesh, num_devices, devices))
    placements = {
        key: Placement(NamedSharding(mesh, PartitionSpec(*pspec)), layouts[key].fused)
        for key, pspec in mapping.pspecs.items()
    }
    tensor_placements = _tensor_placements(proto, placements, jax_model)
    return Compiled(jax_model, mesh, inference, placements, tensor_placements, mapping, config)


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


def _tensor_placements(
    proto: onnx.ModelProto, placements: Mapping[SpecKey, Placement], model: JaxModel
) -> dict[str, Placement]:
    """One placement per tensor: a parameter's from its first consumer, an output's from its producer."""
    by_tensor: dict[str, Placement] = {}
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            key = SpecKey(node.name, "in", position, name)
            if name in model.params and key in placements and name not in by_tensor:
                by_tensor[name] = placements[key]
        for position, name in enumerate(node.output):
            key = SpecKey(node.name, "out", position, name)
            if key in placements:
                by_tensor[name] = placements[key]
    return by_tensor
