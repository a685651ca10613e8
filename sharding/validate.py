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

from collections.abc import Iterator, Mapping, Sequence

import onnx

from sharding import codes
from sharding.annotation_checks import Shapes, check_node
from sharding.diagnostics import Diagnostic, ShardingError
from sharding.shapes import Shape, tensor_shapes
from sharding.model_arg import takes_model


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
    known = Shapes(declared, sized)
    configs, config_diags = _check_configurations(model)
    diags += config_diags
    diags += _check_node_names(model)
    for index, node in enumerate(model.graph.node):
        diags += check_node(index, node, configs, known)
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
