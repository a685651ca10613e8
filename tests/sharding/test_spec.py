"""Typed spec values: proto round trips, construction checks, helpers, canonical equality."""

import onnx
import pytest
from onnx import helper

from sharding import (
    DeviceConfiguration,
    NodeConfig,
    Placement,
    ShardedDim,
    ShardingSpec,
    SimpleShardedDim,
    device_configurations,
    read_model_configs,
    same_placement,
)


def split_dim(axis, *parts):
    """A ShardedDimProto; each part is num_shards or (dim_value or dim_param, num_shards)."""
    dim = onnx.ShardedDimProto(axis=axis)
    for part in parts:
        simple = dim.simple_sharding.add()
        if isinstance(part, tuple):
            size, part = part
            if isinstance(size, str):
                simple.dim_param = size
            else:
                simple.dim_value = size
        simple.num_shards = part
    return dim


def spec_proto(name, devices, dims=(), groups=()):
    proto = onnx.ShardingSpecProto(tensor_name=name, device=devices, sharded_dim=dims)
    for key, members in groups:
        proto.index_to_device_group_map.add(key=key, value=members)
    return proto


# Proposal 0006's and 0007's specs, written as protos and as the values expected.
PROTO_CASES = {
    "0006 axis 0": (
        spec_proto("X", [0, 1], [split_dim(0, 2)]),
        ShardingSpec("X", (ShardedDim(0, (SimpleShardedDim(2),)),), (0, 1)),
    ),
    "0006 axis 1": (
        spec_proto("X", [0, 1], [split_dim(1, 2)]),
        ShardingSpec("X", (ShardedDim(1, (SimpleShardedDim(2),)),), (0, 1)),
    ),
    "0006 2x2": (
        spec_proto("X", [0, 1, 2, 3], [split_dim(0, 2), split_dim(1, 2)]),
        ShardingSpec(
            "X",
            (ShardedDim(0, (SimpleShardedDim(2),)), ShardedDim(1, (SimpleShardedDim(2),))),
            (0, 1, 2, 3),
        ),
    ),
    "0006 replicated": (
        spec_proto("X", [-1], [], [(-1, [0, 1])]),
        ShardingSpec("X", (), (-1,), ((-1, (0, 1)),)),
    ),
    "0006 mixed / 0007 Input1": (
        spec_proto("X", [-1, -2], [split_dim(0, 2)], [(-1, [0, 1]), (-2, [2, 3])]),
        ShardingSpec(
            "X", (ShardedDim(0, (SimpleShardedDim(2),)),), (-1, -2), ((-1, (0, 1)), (-2, (2, 3)))
        ),
    ),
    "fused gate/up with sizes": (
        spec_proto("W", [3, 1], [split_dim(-1, (2, 1), (64, 2))]),
        ShardingSpec(
            "W",
            (
                ShardedDim(
                    -1, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(2, dim_value=64))
                ),
            ),
            (3, 1),
        ),
    ),
    "symbolic size": (
        spec_proto("X", [0, 1], [split_dim(0, ("batch", 2))]),
        ShardingSpec("X", (ShardedDim(0, (SimpleShardedDim(2, dim_param="batch"),)),), (0, 1)),
    ),
}


@pytest.mark.parametrize("proto, value", PROTO_CASES.values(), ids=PROTO_CASES.keys())
def test_sharding_spec_proto_round_trip(proto, value):
    assert ShardingSpec.from_proto(proto) == value
    assert value.to_proto() == proto
    assert (
        ShardingSpec.from_proto(proto).to_proto().SerializeToString() == proto.SerializeToString()
    )


def test_groups_are_sorted_with_minus_one_first():
    proto = spec_proto("X", [-2, -1], [split_dim(0, 2)], [(-2, [2, 3]), (-1, [0, 1])])
    spec = ShardingSpec.from_proto(proto)
    assert spec.groups == ((-1, (0, 1)), (-2, (2, 3)))
    assert [e.key for e in spec.to_proto().index_to_device_group_map] == [-1, -2]


def test_node_config_round_trip_keeps_pipeline_stage_presence():
    absent = onnx.NodeDeviceConfigurationProto(
        configuration_id="tp", sharding_spec=[spec_proto("X", [0])]
    )
    value = NodeConfig.from_proto(absent)
    assert value == NodeConfig("tp", (ShardingSpec("X", (), (0,)),), None)
    assert not value.to_proto().HasField("pipeline_stage")
    assert value.to_proto() == absent

    stage_zero = onnx.NodeDeviceConfigurationProto(configuration_id="pp", pipeline_stage=0)
    value = NodeConfig.from_proto(stage_zero)
    assert value == NodeConfig("pp", (), 0)
    assert value.to_proto().HasField("pipeline_stage")
    assert value.to_proto() == stage_zero


def test_device_configuration_round_trip():
    named = onnx.DeviceConfigurationProto(name="tp", num_devices=2, device=["gpu:0", "gpu:1"])
    assert DeviceConfiguration.from_proto(named) == DeviceConfiguration("tp", 2, ("gpu:0", "gpu:1"))
    assert DeviceConfiguration.from_proto(named).to_proto() == named
    bare = onnx.DeviceConfigurationProto(name="pp", num_devices=4)
    assert DeviceConfiguration.from_proto(bare) == DeviceConfiguration("pp", 4)
    assert DeviceConfiguration.from_proto(bare).to_proto() == bare


@pytest.mark.parametrize(
    "proto, field",
    [
        (onnx.ShardingSpecProto(device=[0]), "tensor_name"),
        (
            spec_proto("X", [0, 1], [onnx.ShardedDimProto(simple_sharding=[{"num_shards": 2}])]),
            "axis",
        ),
        (spec_proto("X", [0], [onnx.ShardedDimProto(axis=0, simple_sharding=[{}])]), "num_shards"),
    ],
)
def test_from_proto_rejects_missing_required_fields(proto, field):
    with pytest.raises(ValueError, match=field):
        ShardingSpec.from_proto(proto)


def test_node_and_device_configuration_require_their_ids():
    with pytest.raises(ValueError, match="configuration_id"):
        NodeConfig.from_proto(onnx.NodeDeviceConfigurationProto())
    with pytest.raises(ValueError, match="num_devices"):
        DeviceConfiguration.from_proto(onnx.DeviceConfigurationProto(name="tp"))


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: SimpleShardedDim(0), ValueError, "num_shards must be >= 1"),
        (lambda: SimpleShardedDim(True), TypeError, "num_shards must be an int"),
        (lambda: SimpleShardedDim(2, dim_value=-1), ValueError, "dim_value must be >= 0"),
        (lambda: SimpleShardedDim(2, dim_value=4, dim_param="N"), ValueError, "exclusive"),
        (lambda: ShardedDim(0, ()), ValueError, "parts must not be empty"),
        (lambda: ShardedDim(0, (2,)), TypeError, "must hold SimpleShardedDim"),
        (lambda: ShardingSpec("X", (), (-1,), ((-1, ()),)), ValueError, "group -1 is empty"),
        (lambda: ShardingSpec("X", (), (0,), ((1, (0,)),)), ValueError, "key 1 must be negative"),
        (
            lambda: ShardingSpec("X", (), (-2,), ((-1, (0,)),)),
            ValueError,
            "key -2 is not in groups",
        ),
        (lambda: ShardingSpec.split("X", {0: 2}, [0]), ValueError, "1 entries but the spec has 2"),
        (lambda: ShardingSpec(3, (), (0,)), TypeError, "tensor_name must be a str"),
        (
            lambda: ShardingSpec(
                "X",
                (ShardedDim(1, (SimpleShardedDim(2),)), ShardedDim(1, (SimpleShardedDim(2),))),
                (0, 1, 2, 3),
            ),
            ValueError,
            "axis 1 is listed twice",
        ),
        (
            lambda: NodeConfig("tp", (ShardingSpec("X", (), (0,)),) * 2),
            ValueError,
            "'X' has two specs",
        ),
        (lambda: DeviceConfiguration("tp", 0), ValueError, "num_devices must be >= 1"),
        (lambda: DeviceConfiguration("tp", 2, ("a",)), ValueError, "names 1 devices"),
    ],
)
def test_construction_rejects_invalid_values(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_helpers():
    spec = ShardingSpec.split("X", {0: 2, 1: 3}, [5, [0, 1], 2, 3, [7, 6], 4])
    assert spec.num_shards == 6
    assert spec.devices == (5, -1, 2, 3, -2, 4)
    assert spec.groups == ((-1, (0, 1)), (-2, (7, 6)))
    assert spec.devices_of_shard(0) == (5,)
    assert spec.devices_of_shard(4) == (7, 6)
    assert spec.all_devices() == (0, 1, 2, 3, 4, 5, 6, 7)
    with pytest.raises(IndexError):
        spec.devices_of_shard(6)
    assert ShardingSpec.replicated("X", [0, 1]) == ShardingSpec("X", (), (-1,), ((-1, (0, 1)),))
    assert ShardingSpec.replicated("X", [3]) == ShardingSpec("X", (), (3,))


def test_values_are_frozen_and_hashable():
    spec = ShardingSpec.split("X", {0: 2}, [0, 1])
    with pytest.raises(AttributeError):
        spec.devices = (1, 0)  # type: ignore[misc]
    assert len({spec, ShardingSpec.split("X", {0: 2}, [0, 1])}) == 1


def fused(axis, *parts, devices):
    return ShardingSpec(
        "X",
        (ShardedDim(axis, tuple(SimpleShardedDim(n, dim_value=size) for size, n in parts)),),
        devices,
    )


def test_fused_axis_that_is_a_plain_split_compares_equal():
    # DESIGN point 5: [{4, 4 shards}, {2, 1 shard}] on an axis of size 8 is a 4-way split.
    a = fused(0, (4, 4), (2, 1), devices=(0, 1, 2, 3))
    b = ShardingSpec.split("X", {0: 4}, [0, 1, 2, 3])
    assert same_placement(a, b, (8,))
    assert a.canonical((8, 3)) == Placement(
        shape=(8, 3), bounds=((0, 2, 4, 6, 8), (0, 3)), cells=((0,), (1,), (2,), (3,))
    )


def test_gate_up_fused_axis_differs_from_plain_split():
    gate_up = fused(1, (2, 1), (4, 2), devices=(0, 1))
    assert gate_up.canonical((3, 8)) == Placement(
        shape=(3, 8), bounds=((0, 3), (0, 2, 4, 6, 8)), cells=((0,), (1,), (0,), (1,))
    )
    assert not same_placement(gate_up, ShardingSpec.split("X", {1: 2}, [0, 1]), (3, 8))


@pytest.mark.parametrize(
    "a, b",
    [
        # Negative axis vs positive axis.
        (ShardingSpec.split("X", {-1: 2}, [0, 1]), ShardingSpec.split("X", {1: 2}, [0, 1])),
        # A 1-shard dim is no sharding.
        (
            ShardingSpec.split("X", {0: 1, 1: 2}, [0, 1]),
            ShardingSpec.split("X", {1: 2}, [0, 1]),
        ),
        # Order of sharded_dims with the devices renumbered to match.
        (
            ShardingSpec.split("X", {0: 2, 1: 2}, [0, 1, 2, 3]),
            ShardingSpec.split("X", {1: 2, 0: 2}, [0, 2, 1, 3]),
        ),
        # Group keys and the order of devices inside a group.
        (
            ShardingSpec(
                "X", (ShardedDim(0, (SimpleShardedDim(2),)),), (-5, -2), {-5: (1, 0), -2: (3, 2)}
            ),
            ShardingSpec.split("X", {0: 2}, [[0, 1], [2, 3]]),
        ),
        # A whole tensor on one group vs a 2-way split whose shards are both on it.
        (ShardingSpec.replicated("X", [0, 1]), ShardingSpec.split("X", {0: 2}, [[0, 1], [1, 0]])),
        # Uneven: 5 rows in 4 blocks of 2 leave the fourth empty, so it is 3 blocks of 2.
        (ShardingSpec.split("X", {0: 4}, [0, 1, 2, 3]), ShardingSpec.split("X", {0: 3}, [0, 1, 2])),
    ],
)
def test_same_placement_ignores_how_it_is_written(a, b):
    assert same_placement(a, b, (5, 4))


@pytest.mark.parametrize(
    "a, b",
    [
        (ShardingSpec.split("X", {0: 2}, [0, 1]), ShardingSpec.split("X", {0: 2}, [1, 0])),
        (ShardingSpec.split("X", {0: 2}, [0, 1]), ShardingSpec.split("X", {1: 2}, [0, 1])),
        (ShardingSpec.split("X", {0: 2}, [0, 1]), ShardingSpec.replicated("X", [0, 1])),
        (
            ShardingSpec.split("X", {0: 2}, [[0, 1], [2, 3]]),
            ShardingSpec.split("X", {0: 2}, [[0, 1], [2]]),
        ),
    ],
)
def test_same_placement_tells_different_placements_apart(a, b):
    assert not same_placement(a, b, (4, 4))


def test_canonical_rejects_specs_that_do_not_fit_the_shape():
    with pytest.raises(ValueError, match="axis 2 is out of range for rank 2"):
        ShardingSpec.split("X", {2: 2}, [0, 1]).canonical((4, 4))
    with pytest.raises(
        ValueError, match=r"sub-axis sizes \(4, 2\) multiply to 8, but the axis has size 6"
    ):
        fused(0, (4, 4), (2, 1), devices=(0, 1, 2, 3)).canonical((6,))
    with pytest.raises(ValueError, match="axis 0 is sharded twice"):
        ShardingSpec.split("X", {0: 2, -2: 2}, [0, 1, 2, 3]).canonical((4, 4))


def test_one_unwritten_sub_axis_size_is_inferred():
    dim = ShardedDim(0, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(2)))
    assert dim.part_sizes(12) == (2, 6)
    with pytest.raises(ValueError, match="does not divide the axis size 7"):
        dim.part_sizes(7)


def annotated_model():
    nodes = [
        helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm0"),
        helper.make_node("Relu", ["Y"], ["Z"], name="relu0"),
        helper.make_node("Relu", ["Z"], ["Out"], name="plain"),
    ]
    nodes[0].device_configurations.add().CopyFrom(
        NodeConfig("tp", (ShardingSpec.split("W", {1: 2}, [0, 1]),)).to_proto()
    )
    nodes[0].device_configurations.add().CopyFrom(NodeConfig("pp", (), 0).to_proto())
    nodes[1].device_configurations.add().CopyFrom(
        NodeConfig("tp", (ShardingSpec.split("Z", {1: 2}, [0, 1]),)).to_proto()
    )
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("X", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Out", onnx.TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor("W", onnx.TensorProto.FLOAT, [4, 6], [0.0] * 24)],
    )
    model = helper.make_model(graph)
    model.configuration.add(name="tp", num_devices=2)
    model.configuration.add(name="pp", num_devices=1)
    return model


def test_read_model_configs_and_device_configurations():
    model = annotated_model()
    assert read_model_configs(model) == {
        "tp": {
            "mm0": NodeConfig("tp", (ShardingSpec.split("W", {1: 2}, [0, 1]),)),
            "relu0": NodeConfig("tp", (ShardingSpec.split("Z", {1: 2}, [0, 1]),)),
        },
        "pp": {"mm0": NodeConfig("pp", (), 0)},
    }
    assert device_configurations(model) == {
        "tp": DeviceConfiguration("tp", 2),
        "pp": DeviceConfiguration("pp", 1),
    }


def test_read_model_configs_needs_unique_names_of_annotated_nodes():
    model = annotated_model()
    model.graph.node[1].name = "mm0"
    with pytest.raises(ValueError, match="node 'mm0' \\(Relu\\): node name is used by two"):
        read_model_configs(model)
    model.graph.node[1].name = ""
    with pytest.raises(
        ValueError, match="node #1 \\(Relu\\) has device_configurations but no name"
    ):
        read_model_configs(model)


def test_read_model_configs_names_the_node_of_an_invalid_annotation():
    model = annotated_model()
    model.graph.node[1].device_configurations[0].sharding_spec[0].device.append(2)
    with pytest.raises(
        ValueError, match="node 'relu0' \\(Relu\\): ShardingSpec.devices has 3 entries"
    ):
        read_model_configs(model)


def test_device_configurations_rejects_a_repeated_name():
    model = annotated_model()
    model.configuration.add(name="tp", num_devices=4)
    with pytest.raises(ValueError, match="'tp' is defined twice"):
        device_configurations(model)


def test_repr_is_short():
    assert repr(ShardingSpec.split("W", {1: 2}, [0, 1])) == "ShardingSpec('W', '1:2 @ [0,1]')"
