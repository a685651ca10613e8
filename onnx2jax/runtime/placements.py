"""Where a compiled model's values live on the mesh.

A completed inference's specs are laid out at concrete shapes
(:func:`spec_layouts`), mapped onto one jax ``Mesh`` (:func:`mesh_for`, the
user's or one searched from the layouts) and turned into a
:class:`~onnx2jax.runtime.placement_keys.TensorPlacement` per node input and output
(:func:`placements_on`). From those come each graph input's placement (its
first annotated reader's: :func:`input_placements`, :func:`place_on_mesh`)
and each graph output's sharding (its producer's: :func:`output_placements`,
:func:`output_shardings`), so that XLA never picks an input or output layout.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.errors import DeviceCountError, TargetError
from sharding import codes
from sharding.mesh.layout import Layout, MeshPlan, layout_of
from sharding.mesh.mapping import MeshMapping, map_specs
from onnx2jax.runtime.parameters import holdable_sharding
from onnx2jax.runtime.targets import data_axis_of, has_attached_devices, target_mesh
from sharding.diagnostics import Diagnostic, ShardingError

if TYPE_CHECKING:
    import sharding

    from onnx2jax.runtime.targets import Target


def _concrete(shape: tuple) -> tuple[int, ...]:
    """Sizes for layout purposes; unknown dims only matter for fused axes, which carry their sizes."""
    return tuple(d if isinstance(d, int) else 0 for d in shape)


def _plan_for_mesh(mesh: Mesh, num_devices: int, device_ids: Sequence[int] | None, configuration: str | None) -> MeshPlan:
    """Configuration device i sits at flat mesh position ``device_ids[i]`` (row-major by default)."""
    if mesh.devices.size != num_devices:
        raise DeviceCountError(
            configuration, num_devices, mesh.devices.size, mesh=True,
            hint=len(jax.devices()) < num_devices and has_attached_devices(mesh),
        )
    positions = list(range(num_devices)) if device_ids is None else list(device_ids)
    if sorted(positions) != list(range(num_devices)):
        raise ValueError(f"devices= must be a permutation of range({num_devices}), got {positions}")
    order = [0] * num_devices
    for config_device, position in enumerate(positions):
        order[position] = config_device
    return MeshPlan(tuple(mesh.axis_names), tuple(mesh.devices.shape), tuple(order))


def mesh_for(
    layouts: Mapping[SpecKey, Layout],
    config: str,
    num_devices: int,
    mesh: Mesh | None,
    devices: Sequence[int] | None,
    jax_devices: Sequence[jax.Device] | None,
    target: "Target | None" = None,
) -> tuple[Mesh, MeshMapping]:
    """The mesh the specs run on (the user's, or one searched from the layouts) and the specs mapped onto it.

    With a ``target`` (and no mesh), the searched mesh's axes are laid over the target's devices in their
    physical order (:func:`onnx2jax.runtime.targets.target_mesh`; several slices: the data axis across them).
    """
    if mesh is not None:
        return mesh, map_specs(layouts, num_devices, _plan_for_mesh(mesh, num_devices, devices, config))
    if target is not None and jax_devices is None:
        have = len(target.devices())
        if have != num_devices:
            raise TargetError(
                target.name, f"configuration {config!r} has {num_devices} devices, the target {have}: choose a "
                f"target of {num_devices} devices, or write the plan for {have}",
            )
        mapping = map_specs(layouts, num_devices)
        names, sizes = mapping.plan.axis_names, mapping.plan.axis_sizes
        return target_mesh(target, names, sizes, data_axis_of(names, sizes, target.slices)), mapping
    jax_devices = list(jax_devices) if jax_devices is not None else jax.devices()
    if len(jax_devices) < num_devices:
        raise DeviceCountError(config, num_devices, len(jax_devices))
    mapping = map_specs(layouts, num_devices)
    array = np.array([jax_devices[d] for d in mapping.plan.device_order]).reshape(mapping.plan.axis_sizes)
    return Mesh(array, mapping.plan.axis_names), mapping


def spec_layouts(inference: "sharding.Inference", *, strict: bool) -> dict[SpecKey, Layout]:
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
    # A layout depends on the spec's geometry and the shape, not on the tensor's name: the ~10,000 specs of
    # a real model come to a few hundred distinct (geometry, shape) pairs, each laid out once (a Layout is a
    # frozen value, shared).
    laid: dict[tuple, Layout] = {}
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
                concrete = _concrete(shape)
                geometry = (spec.sharded_dims, spec.devices, spec.groups, concrete)
                try:
                    layout = laid.get(geometry)
                    if layout is None:
                        layout = laid[geometry] = layout_of(spec, concrete)
                    layouts[SpecKey(name, kind, position, spec.tensor_name)] = layout
                except ValueError as e:
                    axis = next((d.axis for d in spec.sharded_dims if len(d.parts) > 1), None)
                    raise ShardingError([_fused_axis_error(name, node.op_type, spec.tensor_name, axis, str(e))]) from e
    return layouts


def placements_on(
    mapping: MeshMapping, layouts: Mapping[SpecKey, Layout], mesh: Mesh
) -> dict[SpecKey, TensorPlacement]:
    """Every laid-out spec as a NamedSharding on ``mesh`` (with whether it fuses an axis).

    Thousands of specs of a real model come to a few distinct partition specs: one NamedSharding is made per
    distinct one (equal values, a fraction of the construction time).
    """
    shardings: dict[tuple, NamedSharding] = {}
    placements = {}
    for key, pspec in mapping.pspecs.items():
        entries = tuple(pspec)
        sharding = shardings.get(entries)
        if sharding is None:
            sharding = shardings[entries] = NamedSharding(mesh, PartitionSpec(*entries))
        placements[key] = TensorPlacement(sharding, layouts[key].fused)
    return placements


def output_placements(proto: onnx.ModelProto, placements: Mapping[SpecKey, TensorPlacement]) -> tuple:
    """Each graph output's placement from its producer's spec (None: no spec)."""
    produced: dict[str, TensorPlacement] = {}
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


def input_placements(
    proto: onnx.ModelProto, placements: Mapping[SpecKey, TensorPlacement]
) -> dict[str, TensorPlacement]:
    """Each graph input's placement from the first node input that reads it with a spec."""
    names = {i.name for i in proto.graph.input}
    found: dict[str, TensorPlacement] = {}
    for node in proto.graph.node:
        for position, name in enumerate(node.input):
            placement = placements.get(SpecKey(node.name, "in", position, name))
            if name in names and name not in found and placement is not None:
                found[name] = placement
    return found


def place_on_mesh(
    values: Mapping[str, Any], in_placements: Mapping[str, TensorPlacement], mesh: Mesh
) -> dict[str, Any]:
    """Every runtime input as a jax.Array on ``mesh``, so that XLA never picks an input layout.

    A jax.Array already on the mesh's devices is used as it is. Anything
    else is placed with its first reader's spec when JAX can hold it
    (each device receives only its slice), else replicated; the reader's
    constraint then reshards inside the program. (Left to XLA, an input
    whose spec does not divide its shape got an uneven layout that jax
    then refused with IndivisibleError.)
    """
    mesh_devices = set(mesh.devices.flat)
    placed = {}
    for name, value in values.items():
        if isinstance(value, jax.core.Tracer) or (
            isinstance(value, jax.Array) and value.sharding.device_set == mesh_devices
        ):
            placed[name] = value
            continue
        if isinstance(value, jax.ShapeDtypeStruct) and getattr(value.sharding, "device_set", None) == mesh_devices:
            placed[name] = value  # lowering without data (PipelineCompiled.lower): placed as given
            continue
        placed[name] = jax.device_put(value, input_sharding(tuple(np.shape(value)), in_placements.get(name), mesh))
    return placed


def abstract_on_mesh(
    values: Mapping[str, Any], in_placements: Mapping[str, TensorPlacement], mesh: Mesh
) -> dict[str, Any]:
    """Every runtime input as :func:`place_on_mesh` would place it, but without data: a ShapeDtypeStruct with
    the sharding a call would give it (a jax.Array or ShapeDtypeStruct already on the mesh's devices is kept).

    For lowering where the mesh's devices cannot hold data (compile-only devices of a TPU topology), or
    where placing would only cost time (``lower()``, ``report()``).
    """
    mesh_devices = set(mesh.devices.flat)
    found = {}
    for name, value in values.items():
        sharding = getattr(value, "sharding", None)
        if isinstance(value, jax.core.Tracer) or getattr(sharding, "device_set", None) == mesh_devices:
            found[name] = value
            continue
        shape = tuple(np.shape(value)) if not isinstance(value, jax.ShapeDtypeStruct) else tuple(value.shape)
        dtype = value.dtype if hasattr(value, "dtype") else np.asarray(value).dtype
        found[name] = jax.ShapeDtypeStruct(shape, dtype, sharding=input_sharding(shape, in_placements.get(name), mesh))
    return found


def input_sharding(shape: tuple[int, ...], placement: TensorPlacement | None, mesh: Mesh) -> jax.sharding.Sharding:
    """Where :func:`place_on_mesh` puts an input of ``shape`` whose first reader's placement is ``placement``:
    that spec where JAX can hold it, else replicated."""
    if placement is None or placement.fused:
        return NamedSharding(mesh, PartitionSpec())
    return holdable_sharding(shape, placement.sharding)


def output_shardings(
    mesh: Mesh, names: Sequence[str], wanted: tuple, outputs: Sequence[jax.ShapeDtypeStruct | None]
) -> tuple:
    """The sharding each of the outputs ``names`` comes back with: never left to XLA.

    An output whose producer has a spec comes back in it; one without a
    spec comes back replicated on the mesh. A spec JAX cannot hold comes
    back as :func:`holdable_output` makes it (split on another axis, or
    replicated only where no axis divides), with a warning naming the
    output and what it became. ``outputs`` (their shapes) may be None where
    ``wanted`` is: an output without a spec needs no shape.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    shardings = []
    for name, placement, output in zip(names, wanted, outputs):
        named = replicated
        if placement is not None:
            named, why = holdable_output(tuple(output.shape), placement)
            if why is not None:  # stacklevel 4: past this, Compiled._program and the Compiled method called
                warnings.warn(f"output {name!r} {list(output.shape)}: {why}", stacklevel=4)
        shardings.append(named)
    return tuple(shardings)


def holdable_output(shape: tuple[int, ...], placement: TensorPlacement) -> tuple[NamedSharding, str | None]:
    """The sharding an output of ``shape`` placed as ``placement`` comes back with, and why, if not as placed.

    JAX holds no unevenly sharded array, and a fused axis's shards are not
    tiles of the ONNX tensor. The mesh axes on such an axis move, together,
    to the first other axis that they (with the mesh axes already there)
    divide evenly: GPT-2's logits [1, 128, 50257] with the vocabulary split
    8 ways come back split 8 ways on the sequence (an all-to-all of each
    device's 1/8, where replicating them all-gathers the whole logits onto
    every device). Only where no axis divides (a one-token decode step) do
    they replicate. The other axes keep their spec. A fused axis whose only
    split sub-axis is its leading one is a plain split of the axis.
    """
    named = placement.sharding
    sizes = dict(named.mesh.shape)
    fused = dict(placement.fused)
    expanded = tuple(named.spec) + (None,) * (len(placement.expand(shape)) - len(named.spec))
    entries: list[tuple[str, ...]] = []
    bad: list[int] = []
    position = 0
    for axis, size in enumerate(shape):
        parts = expanded[position : position + len(fused.get(axis, (size,)))]
        position += len(parts)
        split = [i for i, entry in enumerate(parts) if entry is not None]
        entries.append(tuple(a for entry in parts for a in _mesh_axes(entry)))
        if entries[axis] and (split != [0] if axis in fused else size % _ways(entries[axis], sizes)):
            bad.append(axis)
    if not bad:
        return (named if not fused else NamedSharding(named.mesh, _pspec(entries))), None
    moving = tuple(a for axis in bad for a in entries[axis])
    for axis in bad:
        entries[axis] = ()
    target = next(
        (a for a, size in enumerate(shape) if a not in bad and size % _ways(entries[a] + moving, sizes) == 0), None
    )
    if target is not None:
        entries[target] += moving
    result = NamedSharding(named.mesh, _pspec(entries))
    axes = ", ".join(f"axis {a} ({shape[a]})" for a in bad)
    why = (
        f"its spec splits {axes} over mesh axes {list(moving)}, "
        + ("which do not divide it evenly (JAX holds no unevenly sharded array)" if any(a not in fused for a in bad)
           else "fused, so that its shards are not tiles of the ONNX tensor")
    )
    if target is not None:
        return result, f"{why}, so it comes back split on axis {target} instead"
    if any(entries):
        return result, f"{why}, and no other axis divides evenly, so it comes back replicated over those mesh axes"
    return result, f"{why}, and no other axis divides evenly, so it comes back replicated"


def _mesh_axes(entry: Any) -> tuple[str, ...]:
    return () if entry is None else (entry if isinstance(entry, tuple) else (entry,))


def _ways(axes: tuple[str, ...], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in axes)


def _pspec(entries: Sequence[tuple[str, ...]]) -> PartitionSpec:
    return PartitionSpec(*(None if not e else e[0] if len(e) == 1 else e for e in entries))


def _fused_axis_error(node: str, op_type: str, tensor: str, axis: int | None, why: str) -> Diagnostic:
    return Diagnostic(
        code=codes.FUSED_AXIS_SIZE,
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
        code=codes.SHAPE_UNKNOWN,
        severity="error",
        node=node,
        op_type=op_type,
        tensor=tensor,
        message="the tensor has a sharding spec but ONNX shape inference gives it no shape",
        hint="add value_info with the tensor's shape to the model",
    )
