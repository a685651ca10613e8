"""Writing multi-device annotations into a ModelProto: the builders.

The builders (`add_configuration`, `set_spec`, `set_specs`, `set_stage`, `annotate_tensor`)
write one thing each and work **in place** on the `ModelProto` they are
given, like protobuf setters; they return names, not models. `describe_plan`
reads every annotation back as table rows. Plans that annotate a whole model
(`sharding.megatron.megatron_plan`) are built on them.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, NamedTuple

import onnx
import onnx.numpy_helper
import onnx.shape_inference

from sharding.model_configs import read_model_configs
from sharding.spec import ShardingSpec
from sharding.model_arg import takes_model
from sharding.text import format_spec

# ---------------------------------------------------------------------------
# Builders (in place)
# ---------------------------------------------------------------------------


MULTI_DEVICE_IR_VERSION = 11


@takes_model(in_place=True)
def add_configuration(model: onnx.ModelProto, name: str, num_devices: int) -> str:
    """Adds a `DeviceConfigurationProto` to ``model.configuration`` if missing (in place).

    Args:
        model: The model (a ModelProto or an onnx_ir.Model); modified in place.
        name: The configuration's name.
        num_devices: Its number of devices (>= 1).

    Returns:
        ``name``.

    Raises:
        ValueError: ``num_devices`` < 1, or a configuration ``name`` exists
            with another number of devices.

    Example:
        >>> add_configuration(model, "tp", 8)  # doctest: +SKIP
        'tp'
    """
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be an int >= 1, got {num_devices!r}")
    for config in model.configuration:
        if config.name == name:
            if config.num_devices != num_devices:
                raise ValueError(
                    f"configuration {name!r} already exists with {config.num_devices} "
                    f"devices, not {num_devices}"
                )
            return name
    model.configuration.append(onnx.DeviceConfigurationProto(name=name, num_devices=num_devices))
    # The multi-device fields exist from IR version 11 (onnx 1.18): readers of an older IR
    # version (onnx_ir, onnxruntime) drop them, so the model must say 11 or later.
    model.ir_version = max(model.ir_version, MULTI_DEVICE_IR_VERSION)
    return name


def _configuration(
    model: onnx.ModelProto, configuration: str | None
) -> onnx.DeviceConfigurationProto:
    names = [c.name for c in model.configuration]
    if configuration is None:
        if len(names) != 1:
            found = f"configurations {names}" if names else "no configuration"
            raise ValueError(f"the model has {found}; name one (or add one with add_configuration)")
        configuration = names[0]
    for config in model.configuration:
        if config.name == configuration:
            return config
    raise ValueError(
        f"configuration {configuration!r} is not in the model (it has {names}); "
        "add it with add_configuration"
    )


def _node(model: onnx.ModelProto, node_name: str) -> onnx.NodeProto:
    return _named([n for n in model.graph.node if n.name == node_name], node_name)


def _named(found: list[onnx.NodeProto], node_name: str) -> onnx.NodeProto:
    if not found:
        raise ValueError(f"no node named {node_name!r} in the main graph")
    if len(found) > 1:
        raise ValueError(
            f"{len(found)} nodes are named {node_name!r}; annotated nodes need unique names"
        )
    return found[0]


def _node_config(node: onnx.NodeProto, configuration: str) -> onnx.NodeDeviceConfigurationProto:
    for proto in node.device_configurations:
        if proto.configuration_id == configuration:
            return proto
    return node.device_configurations.add(configuration_id=configuration)


@takes_model(in_place=True)
def set_spec(
    model: onnx.ModelProto,
    node_name: str,
    spec: ShardingSpec,
    configuration: str | None = None,
) -> None:
    """Writes ``spec`` on one input or output of a node (in place).

    The spec goes into the node's `NodeDeviceConfigurationProto` for the
    configuration (created when missing); a spec already written there for
    ``spec.tensor_name`` is replaced.

    Args:
        model: The model (a ModelProto or an onnx_ir.Model); modified in place.
        node_name: The node (names must be unique).
        spec: The spec; ``spec.tensor_name`` must be an input or output of
            the node.
        configuration: The configuration's name; None means the model's only
            configuration.

    Raises:
        ValueError: No such node or configuration, the tensor is not an input
            or output of the node, or a device is outside the configuration.
    """
    config = _configuration(model, configuration)
    _write_spec(_node(model, node_name), node_name, spec, config)


@takes_model(in_place=True)
def set_specs(
    model: onnx.ModelProto,
    specs: Iterable[tuple[str, ShardingSpec]],
    configuration: str | None = None,
) -> None:
    """Writes many ``(node_name, spec)`` pairs, in order, as `set_spec` writes each (in place).

    The graph is indexed by node name once, so a whole plan (hundreds of specs on a graph of thousands of
    nodes) costs one pass over the nodes instead of one per spec; the model written is the one that
    `set_spec` called on each pair in turn writes.

    Raises:
        ValueError: as for `set_spec`, for the first pair that fails (the pairs before it are written).
    """
    config = _configuration(model, configuration)
    index: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        index.setdefault(node.name, []).append(node)
    for node_name, spec in specs:
        _write_spec(_named(index.get(node_name, []), node_name), node_name, spec, config)


def _write_spec(
    node: onnx.NodeProto, node_name: str, spec: ShardingSpec, config: onnx.DeviceConfigurationProto
) -> None:
    tensor = spec.tensor_name
    if not tensor or (tensor not in node.input and tensor not in node.output):
        raise ValueError(
            f"tensor {tensor!r} is not an input or output of node {node_name!r} "
            f"({node.op_type}); its inputs are {list(node.input)} and outputs "
            f"{list(node.output)}"
        )
    bad = [d for d in spec.all_devices() if d >= config.num_devices]
    if bad:
        raise ValueError(
            f"spec for {tensor!r} on node {node_name!r} uses devices {bad}, but "
            f"configuration {config.name!r} has {config.num_devices} devices"
        )
    proto = _node_config(node, config.name)
    for existing in proto.sharding_spec:
        if existing.tensor_name == tensor:
            existing.CopyFrom(spec.to_proto())
            return
    proto.sharding_spec.append(spec.to_proto())


@takes_model(in_place=True)
def set_stage(
    model: onnx.ModelProto, node_name: str, stage: int, configuration: str | None = None
) -> None:
    """Sets a node's ``pipeline_stage`` for a configuration (in place).

    Args:
        model: The model (a ModelProto or an onnx_ir.Model); modified in place.
        node_name: The node (names must be unique).
        stage: The pipeline stage (>= 0).
        configuration: The configuration's name; None means the model's only
            configuration.

    Raises:
        ValueError: No such node or configuration, or ``stage`` < 0.
    """
    if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
        raise ValueError(f"stage must be an int >= 0, got {stage!r}")
    config = _configuration(model, configuration)
    _node_config(_node(model, node_name), config.name).pipeline_stage = stage


@takes_model(in_place=True)
def annotate_tensor(
    model: onnx.ModelProto,
    tensor_name: str,
    spec: ShardingSpec,
    configuration: str | None = None,
) -> list[str]:
    """Writes a spec where a tensor is defined (in place).

    A node output gets the spec on its producer; a model input or initializer
    gets it on the matching input of every node that reads it.

    Args:
        model: The model (a ModelProto or an onnx_ir.Model); modified in place.
        tensor_name: The tensor.
        spec: The spec; its ``tensor_name`` may be empty (as `parse_spec`
            gives it by default) or must equal ``tensor_name``.
        configuration: As for `set_spec`.

    Returns:
        The names of the annotated nodes.

    Raises:
        ValueError: The tensor is unknown, not read by any node, or the spec
            names another tensor; or as for `set_spec`.

    Example:
        >>> annotate_tensor(model, "W", parse_spec("1:2 @ [0,1]"))  # doctest: +SKIP
        ['mm']
    """
    if spec.tensor_name and spec.tensor_name != tensor_name:
        raise ValueError(f"spec is for {spec.tensor_name!r}, not {tensor_name!r}")
    spec = dataclasses.replace(spec, tensor_name=tensor_name)
    graph = model.graph
    producers = [n for n in graph.node if tensor_name in n.output]
    if producers:
        targets = producers
    else:
        defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
        if tensor_name not in defined:
            raise ValueError(
                f"tensor {tensor_name!r} is not a node output, model input or initializer"
            )
        targets = [n for n in graph.node if tensor_name in n.input]
        if not targets:
            raise ValueError(f"no node of the main graph reads {tensor_name!r}")
    for node in targets:
        if not node.name:
            raise ValueError(
                f"a {node.op_type} node using {tensor_name!r} has no name; name it first"
            )
        set_spec(model, node.name, spec, configuration)
    return [n.name for n in targets]


def name_nodes(model: onnx.ModelProto) -> None:
    """Gives unnamed or duplicate-named nodes of the main graph unique names (in place)."""
    used = {n.name for n in model.graph.node if n.name}
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if node.name and node.name not in seen:
            seen.add(node.name)
            continue
        base = node.name or f"{node.op_type}_{index}"
        name, k = base, 1
        while name in used or name in seen:
            name, k = f"{base}_{k}", k + 1
        node.name = name
        used.add(name)
        seen.add(name)


class PlanRow(NamedTuple):
    """One written annotation: a spec (or a stage) of one node."""

    configuration: str
    node: str
    op_type: str
    tensor: str
    spec: str
    stage: int | None


@takes_model()
def describe_plan(model: onnx.ModelProto) -> list[PlanRow]:
    """Every annotation of the main graph, one row per spec, in graph order.

    A node with a stage but no spec gives one row with empty ``tensor`` and
    ``spec``.

    Raises:
        ValueError: As `read_model_configs`.
    """
    configs = read_model_configs(model)
    op_types = {n.name: n.op_type for n in model.graph.node}
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    rows = []
    for config_id, by_node in configs.items():
        for node, config in by_node.items():
            if not config.specs:
                rows.append(PlanRow(config_id, node, op_types[node], "", "", config.pipeline_stage))
            for spec in config.specs:
                rows.append(
                    PlanRow(
                        config_id,
                        node,
                        op_types[node],
                        spec.tensor_name,
                        format_spec(spec),
                        config.pipeline_stage,
                    )
                )
    rows.sort(key=lambda r: order[r.node])
    return rows


__all__ = ["PlanRow", "add_configuration", "annotate_tensor", "describe_plan", "name_nodes", "set_spec", "set_specs", "set_stage"]
