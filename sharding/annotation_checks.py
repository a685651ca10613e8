"""The checks of one annotated node: its tensor names, axes, sizes, shard parts, devices and groups.

`sharding.validate` runs `check_node` on every node of the main graph, after the
model-level checks (configurations, node names); the codes these checks report
are documented there.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic, Severity
from sharding.shapes import Dim, Shape


@dataclass(frozen=True)
class _Node:
    """Where diagnostics point: one node, and what it needs for checks."""

    proto: onnx.NodeProto
    config: str
    num_devices: int | None
    key: str = ""

    def diag(
        self,
        code: str,
        message: str,
        hint: str | None = None,
        *,
        tensor: str | None = None,
        axis: int | None = None,
        severity: Severity = "error",
    ) -> Diagnostic:
        return Diagnostic(
            code=code,
            severity=severity,
            node=self.proto.name or self.key,
            op_type=self.proto.op_type,
            tensor=tensor,
            axis=axis,
            message=message,
            hint=hint,
        )


@dataclass(frozen=True)
class Shapes:
    """Tensor shapes: as the model declares them (symbols kept), and with a call's input sizes."""

    declared: Mapping[str, Shape]
    sized: Mapping[str, Shape]

    def rank_shape(self, tensor: str) -> Shape | None:
        return self.declared.get(tensor) or self.sized.get(tensor)



def _check_tensor_name(node: _Node, spec: onnx.ShardingSpecProto) -> Iterator[Diagnostic]:
    inputs = [n for n in node.proto.input if n]
    outputs = [n for n in node.proto.output if n]
    if spec.tensor_name not in inputs + outputs:
        yield node.diag(
            codes.TENSOR_NOT_IN_NODE,
            f"the spec names tensor {spec.tensor_name!r}, "
            "which is not an input or output of the node",
            f"name one of the inputs {inputs} or outputs {outputs}",
            tensor=spec.tensor_name,
        )


def _check_axes(
    node: _Node, spec: onnx.ShardingSpecProto, shape: Shape | None
) -> Iterator[Diagnostic]:
    tensor = spec.tensor_name
    seen: dict[int, int] = {}
    for dim in spec.sharded_dim:
        if not dim.HasField("axis"):
            yield node.diag(
                codes.AXIS_MISSING,
                "a sharded_dim has no axis",
                "set ShardedDimProto.axis",
                tensor=tensor,
            )
            continue
        axis = key = dim.axis
        if shape is not None:
            rank = len(shape)
            if not -rank <= axis < rank:
                yield node.diag(
                    codes.AXIS_OUT_OF_RANGE,
                    f"axis {axis} is out of range for a tensor of rank {rank} "
                    f"(shape {list(shape)})",
                    f"use an axis in [{-rank}, {rank - 1}]",
                    tensor=tensor,
                    axis=axis,
                )
                continue
            key = axis % rank
        if key in seen:
            yield node.diag(
                codes.AXIS_REPEATED,
                f"axis {axis} is sharded twice (also as axis {seen[key]})",
                "list each axis once; to shard one axis by several factors "
                "use one fused sharded_dim",
                tensor=tensor,
                axis=axis,
            )
        seen[key] = axis


def _axis_size(dim: onnx.ShardedDimProto, shape: Shape | None) -> Dim:
    if shape is None or not dim.HasField("axis") or not -len(shape) <= dim.axis < len(shape):
        return None
    return shape[dim.axis]


def _check_sizes(
    node: _Node, tensor: str, dim: onnx.ShardedDimProto, size: Dim, declared: Dim
) -> Iterator[Diagnostic]:
    """Written sizes against the axis: ``size`` with the call's sizes, ``declared`` as the model says."""
    axis = dim.axis
    parts = dim.simple_sharding
    if len(parts) == 1:
        part = parts[0]
        which = part.WhichOneof("dim")
        if which == "dim_value" and isinstance(size, int) and part.dim_value != size:
            yield node.diag(
                codes.DIM_VALUE_MISMATCH,
                f"dim_value is {part.dim_value} but axis {axis} has size {size}",
                f"write dim_value {size} or leave it out",
                tensor=tensor,
                axis=axis,
            )
        elif which == "dim_value" and not isinstance(size, int):
            yield _unresolved(node, tensor, axis, size, f"dim_value {part.dim_value}")
        if which == "dim_param" and declared is not None and part.dim_param != declared:
            found = (
                f"symbolic size {declared!r}" if isinstance(declared, str) else f"fixed size {declared}"
            )
            yield node.diag(
                codes.DIM_PARAM_MISMATCH,
                f"dim_param is {part.dim_param!r} but axis {axis} has {found}",
                f"write {declared!r} or leave the size out",
                tensor=tensor,
                axis=axis,
            )
        return
    values = [p.dim_value if p.WhichOneof("dim") == "dim_value" else None for p in parts]
    unknown = values.count(None)
    sizes = ["?" if v is None else v for v in values]
    if unknown > 1:
        yield node.diag(
            codes.FUSED_SIZE_UNKNOWN,
            f"fused axis {axis}: {unknown} sub-axes have no dim_value, "
            "so the sub-axis sizes cannot be known",
            "write dim_value on every sub-axis but at most one",
            tensor=tensor,
            axis=axis,
        )
        return
    if not isinstance(size, int):
        yield node.diag(
            codes.FUSED_SIZE_UNRESOLVED,
            f"fused axis {axis} has sub-axis sizes {sizes} but the axis size is {_size_text(size)}, "
            "so they can be checked only against a call's shapes",
            "onnx2jax.compile lays the spec out, and checks it, at each call; "
            "`onnx2jax check --input-shape` fixes the inputs' dims",
            tensor=tensor,
            axis=axis,
            severity="note",
        )
        return
    product = math.prod(v for v in values if v is not None)
    if unknown == 0 and product != size:
        found = f"its sub-axis sizes {sizes} multiply to {product}"
    elif unknown == 1 and (product == 0 or size % product):
        found = f"its written sub-axis sizes {sizes} (product {product}) do not divide it"
    else:
        return
    yield node.diag(
        codes.FUSED_SIZE_MISMATCH,
        f"fused axis {axis} has size {size} but {found}",
        "the sub-axis sizes (dim_value) must multiply to the axis size",
        tensor=tensor,
        axis=axis,
    )


def _size_text(size: Dim) -> str:
    return "unknown" if size is None else f"symbolic ({size!r})"


def _unresolved(node: _Node, tensor: str, axis: int, size: Dim, written: str) -> Diagnostic:
    return node.diag(
        codes.SIZE_UNRESOLVED,
        f"{written} is written for axis {axis}, whose size is {_size_text(size)}: "
        "it is checked once the shapes are known",
        "onnx2jax.compile checks it at each call; `onnx2jax check --input-shape` fixes the inputs' dims",
        tensor=tensor,
        axis=axis,
        severity="note",
    )


def _check_parts(node: _Node, spec: onnx.ShardingSpecProto, shapes: Shapes) -> Iterator[Diagnostic]:
    tensor = spec.tensor_name
    for dim in spec.sharded_dim:
        axis = dim.axis if dim.HasField("axis") else None
        if not dim.simple_sharding:
            yield node.diag(
                codes.SHARDED_DIM_EMPTY,
                "a sharded_dim has no simple_sharding",
                "add one SimpleShardedDimProto with num_shards, or drop the sharded_dim",
                tensor=tensor,
                axis=axis,
            )
            continue
        for part in dim.simple_sharding:
            if not part.HasField("num_shards"):
                yield node.diag(
                    codes.NUM_SHARDS_MISSING,
                    "a simple_sharding has no num_shards",
                    "set num_shards (>= 1)",
                    tensor=tensor,
                    axis=axis,
                )
            elif part.num_shards < 1:
                yield node.diag(
                    codes.NUM_SHARDS_INVALID,
                    f"num_shards is {part.num_shards}",
                    "set num_shards >= 1",
                    tensor=tensor,
                    axis=axis,
                )
            if part.WhichOneof("dim") == "dim_value" and part.dim_value < 0:
                yield node.diag(
                    codes.DIM_VALUE_INVALID,
                    f"dim_value is {part.dim_value}",
                    "sizes are >= 0",
                    tensor=tensor,
                    axis=axis,
                )
        if axis is not None:
            size = _axis_size(dim, shapes.sized.get(tensor) or shapes.declared.get(tensor))
            declared = _axis_size(dim, shapes.declared.get(tensor))
            yield from _check_sizes(node, tensor, dim, size, declared)


def _num_shards(spec: onnx.ShardingSpecProto) -> int | None:
    """The product of all num_shards, or None if one is missing or invalid."""
    counts = [
        p.num_shards if p.HasField("num_shards") else 0
        for d in spec.sharded_dim
        for p in d.simple_sharding
    ]
    return math.prod(counts) if all(c >= 1 for c in counts) else None


def _check_device_id(node: _Node, tensor: str, device: int, where: str) -> Iterator[Diagnostic]:
    limit = node.num_devices
    if device < 0 or (limit is not None and device >= limit):
        bound = f"[0, {limit})" if limit is not None else "[0, ...)"
        yield node.diag(
            codes.DEVICE_OUT_OF_RANGE,
            f"{where} names device {device}, outside {bound} (configuration {node.config!r})",
            f"use device ids in {bound}",
            tensor=tensor,
        )


def _check_devices(node: _Node, spec: onnx.ShardingSpecProto) -> Iterator[Diagnostic]:
    tensor = spec.tensor_name
    groups: dict[int, tuple[int, ...]] = {}
    for entry in spec.index_to_device_group_map:
        key = entry.key
        if key in groups:
            yield node.diag(
                codes.GROUP_KEY_REPEATED,
                f"group key {key} is defined twice",
                "define each key once",
                tensor=tensor,
            )
        if key >= 0:
            yield node.diag(
                codes.GROUP_KEY_NOT_NEGATIVE,
                f"group key {key} is not negative, so it reads as a device",
                "use negative keys (-1, -2, ...) for groups",
                tensor=tensor,
            )
        if not entry.value:
            yield node.diag(
                codes.GROUP_EMPTY,
                f"group {key} has no device",
                "list the devices that replicate the shard",
                tensor=tensor,
            )
        for device in entry.value:
            yield from _check_device_id(node, tensor, device, f"group {key}")
        twice = sorted({d for d in entry.value if list(entry.value).count(d) > 1})
        if twice:
            yield node.diag(
                codes.DEVICE_REPEATED,
                f"group {key} lists device(s) {twice} more than once",
                "list each device of a group once",
                tensor=tensor,
                )
        groups[key] = tuple(entry.value)
    shards = _num_shards(spec)
    if shards is not None and len(spec.device) != shards:
        yield node.diag(
            codes.SHARD_COUNT_MISMATCH,
            f"device lists {len(spec.device)} entries but the sharded_dims make {shards} shards",
            "give one device (or negative group key) per shard: the product of all num_shards",
            tensor=tensor,
        )
    holder: dict[int, int] = {}
    for shard, entry in enumerate(spec.device):
        if entry >= 0:
            yield from _check_device_id(node, tensor, entry, f"shard {shard}")
            members: tuple[int, ...] = (entry,)
        elif entry in groups:
            members = groups[entry]
        else:
            yield node.diag(
                codes.GROUP_KEY_MISSING,
                f"shard {shard} has device entry {entry}, "
                "which is not a key of index_to_device_group_map",
                f"add {entry} to index_to_device_group_map or use a device id >= 0",
                tensor=tensor,
            )
            continue
        for device in dict.fromkeys(members):
            if device in holder:
                yield node.diag(
                    codes.DEVICE_REPEATED,
                    f"device {device} holds shards {holder[device]} and {shard}",
                    "a device should hold one shard of a tensor",
                    tensor=tensor,
                        )
            holder.setdefault(device, shard)


def check_node(
    index: int,
    node_proto: onnx.NodeProto,
    configs: Mapping[str, int | None],
    shapes: Shapes,
) -> Iterator[Diagnostic]:
    """Every problem of node ``index``'s annotations, given the model's configurations (num_devices by name)."""
    seen_configs: set[str] = set()
    for config in node_proto.device_configurations:
        config_id = config.configuration_id
        node = _Node(node_proto, config_id, configs.get(config_id), f"{node_proto.op_type}#{index}")
        if not config.HasField("configuration_id"):
            yield node.diag(
                codes.UNKNOWN_CONFIGURATION,
                "an annotation has no configuration_id",
                f"name one of {sorted(configs)}",
            )
        elif config_id not in configs:
            yield node.diag(
                codes.UNKNOWN_CONFIGURATION,
                f"configuration_id {config_id!r} names no device configuration of the model",
                f"name one of {sorted(configs)} "
                "or add the configuration to ModelProto.configuration",
            )
        if config_id in seen_configs:
            yield node.diag(
                codes.CONFIGURATION_REPEATED,
                f"the node has two annotations for configuration {config_id!r}",
                "merge them into one NodeDeviceConfigurationProto",
            )
        seen_configs.add(config_id)
        if config.HasField("pipeline_stage") and config.pipeline_stage < 0:
            yield node.diag(
                codes.PIPELINE_STAGE_INVALID,
                f"pipeline_stage is {config.pipeline_stage}",
                "pipeline stages are numbered from 0",
            )
        tensors: set[str] = set()
        for spec in config.sharding_spec:
            if spec.tensor_name in tensors:
                yield node.diag(
                    codes.SPEC_REPEATED,
                    f"tensor {spec.tensor_name!r} has two specs in one annotation",
                    "keep one spec per tensor",
                    tensor=spec.tensor_name,
                )
            tensors.add(spec.tensor_name)
            yield from _check_tensor_name(node, spec)
            yield from _check_axes(node, spec, shapes.rank_shape(spec.tensor_name))
            yield from _check_parts(node, spec, shapes)
            yield from _check_devices(node, spec)

