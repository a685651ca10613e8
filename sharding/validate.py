"""Structural validation of a model's multi-device annotations.

Checks what needs no op semantics (that is the checker's job): that every
annotation is well formed and fits its tensor and its device configuration.
Every problem is reported in one pass, as a `Diagnostic`:

=========================  ========  =========================================
code                       severity  found
=========================  ========  =========================================
shape-inference-failed     warning   ranks come only from the model's own types
configuration-invalid      error     a configuration without name, devices...
configuration-repeated     error     two configurations (or one node's two
                                     annotations) with one name
node-name-missing          error     an annotated node without a name
node-name-repeated         error     two annotated nodes with one name
unknown-configuration      error     configuration_id missing or not defined
tensor-not-in-node         error     tensor_name not an input/output of the node
spec-repeated              error     two specs for one tensor in one annotation
axis-missing               error     a sharded_dim without axis
axis-out-of-range          error     axis outside [-rank, rank)
axis-repeated              error     one axis sharded twice
sharded-dim-empty          error     a sharded_dim without simple_sharding
num-shards-missing         error     a simple_sharding without num_shards
num-shards-invalid         error     num_shards < 1
dim-value-invalid          error     a negative dim_value
dim-value-mismatch         error     dim_value differs from the axis size
dim-param-mismatch         error     dim_param differs from the axis's dim
fused-size-mismatch        error     sub-axis sizes do not multiply to the size
fused-size-unknown         error     two sub-axes without dim_value
size-unresolved            note      a size written on a symbolic axis: checked
                                     once the shapes are known (a call's)
fused-size-unresolved      note      a fused axis of symbolic size: compile
                                     lays it out at each call
pipeline-stage-invalid     error     a negative pipeline_stage
shard-count-mismatch       error     len(device) != product of num_shards
device-out-of-range        error     a device id outside [0, num_devices)
group-key-missing          error     a negative device entry with no group
group-key-not-negative     error     a group key >= 0
group-key-repeated         error     a group key defined twice
group-empty                error     a group with no device
device-repeated            error     a device holding two shards of one tensor,
                                     or listed twice in a group
=========================  ========  =========================================

One verdict: what `onnx2jax.compile` refuses, `check` reports as an error with
the same code. A layout that puts two shards of one tensor on one device, or a
fused axis with two sub-axes of unknown size, has no NamedSharding: both are
errors.

Only the main graph is checked: annotations inside subgraphs (control flow)
are outside the formalism.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic, Severity, ShardingError
from sharding.shapes import tensor_shapes
from sharding.model_arg import takes_model

Dim = int | str | None
Shape = tuple[Dim, ...]


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
class _Shapes:
    """Tensor shapes: as the model declares them (symbols kept), and with a call's input sizes."""

    declared: Mapping[str, Shape]
    sized: Mapping[str, Shape]

    def rank_shape(self, tensor: str) -> Shape | None:
        return self.declared.get(tensor) or self.sized.get(tensor)


def _check_configurations(model: onnx.ModelProto) -> tuple[dict[str, int | None], list[Diagnostic]]:
    """Device configurations by name (num_devices, None when invalid), and their problems."""
    configs: dict[str, int | None] = {}
    diags = []

    def bad(code: str, message: str, hint: str) -> None:
        diags.append(Diagnostic(code=code, severity="error", message=message, hint=hint))

    for index, config in enumerate(model.configuration):
        name = config.name
        if not config.HasField("name") or not name:
            bad(
                codes.CONFIGURATION_INVALID,
                f"configuration #{index} has no name",
                "set DeviceConfigurationProto.name",
            )
            continue
        if name in configs:
            bad(
                codes.CONFIGURATION_REPEATED,
                f"configuration {name!r} is defined twice",
                "give each configuration its own name",
            )
            continue
        num = config.num_devices if config.HasField("num_devices") else None
        if num is None or num < 1:
            bad(
                codes.CONFIGURATION_INVALID,
                f"configuration {name!r} has num_devices {num}",
                "set num_devices to the number of devices (>= 1)",
            )
            num = None
        elif config.device and len(config.device) != num:
            bad(
                codes.CONFIGURATION_INVALID,
                f"configuration {name!r} names {len(config.device)} devices "
                f"but num_devices is {num}",
                "name every device or none",
            )
        configs[name] = num
    return configs, diags


def _check_node_names(model: onnx.ModelProto) -> Iterator[Diagnostic]:
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.device_configurations:
            continue
        if not node.name:
            yield Diagnostic(
                code=codes.NODE_NAME_MISSING,
                severity="error",
                node=f"{node.op_type}#{index}",
                op_type=node.op_type,
                message=f"node #{index} ({node.op_type}) is annotated but has no name",
                hint="give every annotated node a unique name",
            )
        elif node.name in seen:
            yield Diagnostic(
                code=codes.NODE_NAME_REPEATED,
                severity="error",
                node=node.name,
                op_type=node.op_type,
                message=f"node #{index}: another annotated node is also named {node.name!r}",
                hint="give every annotated node a unique name",
            )
        seen.add(node.name)


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


def _check_parts(node: _Node, spec: onnx.ShardingSpecProto, shapes: _Shapes) -> Iterator[Diagnostic]:
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


def _check_node(
    index: int,
    node_proto: onnx.NodeProto,
    configs: Mapping[str, int | None],
    shapes: _Shapes,
) -> Iterator[Diagnostic]:
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


@takes_model()
def validate_model(
    model: onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shapes: tuple[Mapping[str, Shape], Sequence[Diagnostic]] | None = None,
) -> list[Diagnostic]:
    """Every structural problem of the model's multi-device annotations.

    Args:
        model: The model; it is not modified.
        input_shapes: Concrete dims of model inputs (a call's shapes): sizes
            written on symbolic axes (``dim_value``, fused sub-axes) are then
            checked against them; ``dim_param`` is still compared with the
            model's own symbols.
        shapes: ``sharding.shapes.tensor_shapes(model)`` (the model's own
            shapes) when the caller has it already (a compile computes it once).

    Returns:
        The diagnostics, model-level first, then node by node in graph order.
        No diagnostic of severity ``error`` means the annotations are well
        formed.

    Example:
        >>> for d in validate_model(model):  # doctest: +SKIP
        ...     print(d)
        error[axis-repeated] node 'mm0' (MatMul), tensor 'X', axis 1: ...
    """
    annotated = any(node.device_configurations for node in model.graph.node)
    if not annotated:
        declared, diags = {}, []
    else:
        declared, found = shapes if shapes is not None else tensor_shapes(model)
        diags = list(found)
    sized = tensor_shapes(model, input_shapes)[0] if annotated and input_shapes else declared
    known = _Shapes(declared, sized)
    configs, config_diags = _check_configurations(model)
    diags += config_diags
    diags += _check_node_names(model)
    for index, node in enumerate(model.graph.node):
        diags += _check_node(index, node, configs, known)
    return diags


@takes_model()
def require_valid(
    model: onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    shapes: tuple[Mapping[str, Shape], Sequence[Diagnostic]] | None = None,
) -> list[Diagnostic]:
    """Validates the model (see `validate_model`) and raises if any error was found.

    Returns:
        The warnings and notes.

    Raises:
        ShardingError: With every diagnostic, when at least one is an error.
    """
    diags = validate_model(model, input_shapes=input_shapes, shapes=shapes)
    if any(d.severity == "error" for d in diags):
        raise ShardingError(diags)
    return diags
