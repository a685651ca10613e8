"""A model's device configurations and node annotations, as typed values read from it.

`DeviceConfiguration` and `NodeConfig` are frozen dataclasses like the specs of
`sharding.spec` (built from and to their protos); `device_configurations` and
`read_model_configs` read them from a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from sharding._fields import _as_int, _as_str, _as_tuple, _require, _set
from sharding.model_arg import takes_model
from sharding.spec import ShardingSpec


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """A node's annotation for one device configuration.

    Attributes:
        configuration_id: Name of the `DeviceConfiguration` it refers to.
        specs: Specs of (some of) the node's inputs and outputs.
        pipeline_stage: The node's pipeline stage, if written.
    """

    configuration_id: str
    specs: tuple[ShardingSpec, ...] = ()
    pipeline_stage: int | None = None

    def __post_init__(self) -> None:
        _as_str(self.configuration_id, "NodeConfig.configuration_id")
        specs = _as_tuple(self.specs, "NodeConfig.specs")
        names = []
        for spec in specs:
            if not isinstance(spec, ShardingSpec):
                raise TypeError(
                    f"NodeConfig.specs must hold ShardingSpec, got {type(spec).__name__}"
                )
            if spec.tensor_name in names:
                raise ValueError(f"NodeConfig.specs: tensor {spec.tensor_name!r} has two specs")
            names.append(spec.tensor_name)
        _set(self, "specs", specs)
        if self.pipeline_stage is not None:
            _set(self, "pipeline_stage", _as_int(self.pipeline_stage, "NodeConfig.pipeline_stage"))

    def spec_for(self, tensor_name: str) -> ShardingSpec | None:
        """The spec written for ``tensor_name``, or None."""
        return next((s for s in self.specs if s.tensor_name == tensor_name), None)

    @classmethod
    def from_proto(cls, proto: onnx.NodeDeviceConfigurationProto) -> NodeConfig:
        """Builds the value from a `NodeDeviceConfigurationProto`.

        Raises:
            ValueError: ``configuration_id`` is missing or a spec is invalid.
        """
        _require(proto, "configuration_id")
        return cls(
            proto.configuration_id,
            tuple(ShardingSpec.from_proto(s) for s in proto.sharding_spec),
            proto.pipeline_stage if proto.HasField("pipeline_stage") else None,
        )

    def to_proto(self) -> onnx.NodeDeviceConfigurationProto:
        """Returns the equivalent `NodeDeviceConfigurationProto`."""
        proto = onnx.NodeDeviceConfigurationProto(
            configuration_id=self.configuration_id,
            sharding_spec=[s.to_proto() for s in self.specs],
        )
        if self.pipeline_stage is not None:
            proto.pipeline_stage = self.pipeline_stage
        return proto


@dataclass(frozen=True, slots=True)
class DeviceConfiguration:
    """A named set of devices that annotations refer to by index.

    Attributes:
        name: The configuration's name (nodes' ``configuration_id``).
        num_devices: Number of devices, >= 1.
        devices: Optional device names, one per device (the proto's
            ``device`` field holds strings).
    """

    name: str
    num_devices: int
    devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _as_str(self.name, "DeviceConfiguration.name")
        _set(self, "num_devices", _as_int(self.num_devices, "DeviceConfiguration.num_devices", 1))
        devices = _as_tuple(self.devices, "DeviceConfiguration.devices")
        for device in devices:
            _as_str(device, "DeviceConfiguration.devices entry")
        if devices and len(devices) != self.num_devices:
            raise ValueError(
                f"DeviceConfiguration.devices names {len(devices)} devices but "
                f"num_devices is {self.num_devices}"
            )
        _set(self, "devices", devices)

    @classmethod
    def from_proto(cls, proto: onnx.DeviceConfigurationProto) -> DeviceConfiguration:
        """Builds the value from a `DeviceConfigurationProto`.

        Raises:
            ValueError: ``name`` or ``num_devices`` is missing or invalid.
        """
        _require(proto, "name")
        _require(proto, "num_devices")
        return cls(proto.name, proto.num_devices, tuple(proto.device))

    def to_proto(self) -> onnx.DeviceConfigurationProto:
        """Returns the equivalent `DeviceConfigurationProto`."""
        return onnx.DeviceConfigurationProto(
            name=self.name, num_devices=self.num_devices, device=self.devices
        )


@takes_model()
def device_configurations(model: onnx.ModelProto) -> dict[str, DeviceConfiguration]:
    """The model's device configurations, by name.

    Raises:
        ValueError: A configuration is invalid or two share a name.
    """
    result: dict[str, DeviceConfiguration] = {}
    for proto in model.configuration:
        config = DeviceConfiguration.from_proto(proto)
        if config.name in result:
            raise ValueError(f"device configuration {config.name!r} is defined twice")
        result[config.name] = config
    return result


@takes_model()
def read_model_configs(model: onnx.ModelProto) -> dict[str, dict[str, NodeConfig]]:
    """Every node annotation of the main graph, by configuration then node name.

    Args:
        model: The model.

    Returns:
        ``{configuration_id: {node_name: NodeConfig}}``, nodes in graph order.

    Raises:
        ValueError: An annotated node has no name, two annotated nodes share a
            name, a node has two annotations for one configuration, or an
            annotation is invalid.
    """
    result: dict[str, dict[str, NodeConfig]] = {}
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.device_configurations:
            continue
        where = f"node {node.name!r} ({node.op_type})"
        if not node.name:
            raise ValueError(
                f"node #{index} ({node.op_type}) has device_configurations but no name"
            )
        if node.name in seen:
            raise ValueError(f"{where}: node name is used by two annotated nodes")
        seen.add(node.name)
        for proto in node.device_configurations:
            try:
                config = NodeConfig.from_proto(proto)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{where}: {e}") from e
            by_node = result.setdefault(config.configuration_id, {})
            if node.name in by_node:
                raise ValueError(
                    f"{where}: two annotations for configuration {config.configuration_id!r}"
                )
            by_node[node.name] = config
    return result
