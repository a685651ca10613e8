"""Structural validation: one test per problem, each naming the node and the tensor."""

import onnx
import pytest
from onnx import TensorProto, helper

from sharding import Diagnostic, ShardingError, require_valid, validate_model


def sharded_dim(axis=None, *parts):
    """A ShardedDimProto; each part is a dict of SimpleShardedDimProto fields."""
    dim = onnx.ShardedDimProto(simple_sharding=list(parts))
    if axis is not None:
        dim.axis = axis
    return dim


def spec(tensor="W", devices=(0, 1), dims=None, groups=()):
    dims = [sharded_dim(1, {"num_shards": 2})] if dims is None else dims
    proto = onnx.ShardingSpecProto(tensor_name=tensor, device=devices, sharded_dim=dims)
    for key, members in groups:
        proto.index_to_device_group_map.add(key=key, value=members)
    return proto


def model(*specs, config="tp", num_devices=4, stage=None):
    """mm0 = MatMul(X[N, 4], W[4, 6]) -> Y[N, 6], annotated with ``specs`` for ``config``."""
    node = helper.make_node("MatMul", ["X", "W"], ["Y"], name="mm0")
    annotation = node.device_configurations.add(configuration_id=config, sharding_spec=specs)
    if stage is not None:
        annotation.pipeline_stage = stage
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        [helper.make_tensor("W", TensorProto.FLOAT, [4, 6], [0.0] * 24)],
    )
    result = helper.make_model(graph)
    result.configuration.add(name="tp", num_devices=num_devices)
    return result


def only(diagnostics, code):
    found = [d for d in diagnostics if d.code == code]
    assert len(found) == 1, [str(d) for d in diagnostics]
    return found[0]


def test_valid_annotations_have_no_diagnostics():
    assert validate_model(model(spec(), spec("X", (-1,), [], [(-1, (0, 1))]))) == []
    assert require_valid(model(spec())) == []


def test_diagnostic_reads_like_a_compiler_message():
    d = Diagnostic(
        code="axis-repeated",
        severity="error",
        node="mm0",
        op_type="MatMul",
        tensor="X",
        axis=1,
        message="axis 1 is sharded twice",
        hint="list each axis once",
    )
    assert str(d) == (
        "error[axis-repeated] node 'mm0' (MatMul), tensor 'X', axis 1: "
        "axis 1 is sharded twice; hint: list each axis once"
    )
    with pytest.raises(ValueError, match="kebab-case"):
        Diagnostic(code="Axis_Repeated", severity="error", message="")
    with pytest.raises(ValueError, match="severity"):
        Diagnostic(code="axis-repeated", severity="fatal", message="")


# (annotations, code, words the message must hold); node 'mm0' (MatMul) and the tensor are
# checked for every case.
CASES = {
    "axis out of range": (
        spec(dims=[sharded_dim(2, {"num_shards": 2})]),
        "axis-out-of-range",
        "axis 2 is out of range for a tensor of rank 2 (shape [4, 6])",
    ),
    "negative axis out of range": (
        spec("X", dims=[sharded_dim(-3, {"num_shards": 2})]),
        "axis-out-of-range",
        "axis -3 is out of range for a tensor of rank 2 (shape ['N', 4])",
    ),
    "axis repeated": (
        spec(
            devices=(0, 1, 2, 3),
            dims=[sharded_dim(1, {"num_shards": 2}), sharded_dim(-1, {"num_shards": 2})],
        ),
        "axis-repeated",
        "axis -1 is sharded twice (also as axis 1)",
    ),
    "axis missing": (
        spec(dims=[sharded_dim(None, {"num_shards": 2})]),
        "axis-missing",
        "has no axis",
    ),
    "no simple_sharding": (
        spec(devices=(0,), dims=[sharded_dim(1)]),
        "sharded-dim-empty",
        "no simple_sharding",
    ),
    "num_shards missing": (
        spec(devices=(0,), dims=[sharded_dim(1, {})]),
        "num-shards-missing",
        "no num_shards",
    ),
    "num_shards zero": (
        spec(devices=(0,), dims=[sharded_dim(1, {"num_shards": 0})]),
        "num-shards-invalid",
        "num_shards is 0",
    ),
    "negative dim_value": (
        spec(dims=[sharded_dim(1, {"dim_value": -6, "num_shards": 2})]),
        "dim-value-invalid",
        "dim_value is -6",
    ),
    "dim_value differs from the axis": (
        spec(dims=[sharded_dim(1, {"dim_value": 8, "num_shards": 2})]),
        "dim-value-mismatch",
        "dim_value is 8 but axis 1 has size 6",
    ),
    "fused sizes do not multiply to the axis size": (
        spec(
            dims=[
                sharded_dim(1, {"dim_value": 2, "num_shards": 1}, {"dim_value": 4, "num_shards": 2})
            ]
        ),
        "fused-size-mismatch",
        "fused axis 1 has size 6 but its sub-axis sizes [2, 4] multiply to 8",
    ),
    "fused known sizes do not divide the axis size": (
        spec(dims=[sharded_dim(1, {"dim_value": 4, "num_shards": 1}, {"num_shards": 2})]),
        "fused-size-mismatch",
        "its written sub-axis sizes [4, '?'] (product 4) do not divide it",
    ),
    "device count differs from the shards": (
        spec(devices=(0, 1, 2)),
        "shard-count-mismatch",
        "device lists 3 entries but the sharded_dims make 2 shards",
    ),
    "device beyond the configuration": (
        spec(devices=(0, 4)),
        "device-out-of-range",
        "shard 1 names device 4, outside [0, 4) (configuration 'tp')",
    ),
    "device in a group beyond the configuration": (
        spec(devices=(-1, 1), groups=[(-1, (0, 7))]),
        "device-out-of-range",
        "group -1 names device 7",
    ),
    "negative key absent from the map": (
        spec(devices=(0, -2), groups=[(-1, (1, 2))]),
        "group-key-missing",
        "shard 1 has device entry -2, which is not a key of index_to_device_group_map",
    ),
    "empty group": (
        spec(devices=(0, -1), groups=[(-1, ())]),
        "group-empty",
        "group -1 has no device",
    ),
    "group key repeated": (
        spec(devices=(0, -1), groups=[(-1, (1,)), (-1, (2,))]),
        "group-key-repeated",
        "group key -1 is defined twice",
    ),
    "group key not negative": (
        spec(devices=(0, 1), groups=[(3, (1,))]),
        "group-key-not-negative",
        "group key 3 is not negative",
    ),
    "tensor not an input or output of the node": (
        spec("Z"),
        "tensor-not-in-node",
        "names tensor 'Z', which is not an input or output",
    ),
    "dim_param differs from the symbolic dim": (
        spec("X", dims=[sharded_dim(0, {"dim_param": "B", "num_shards": 2})]),
        "dim-param-mismatch",
        "dim_param is 'B' but axis 0 has symbolic size 'N'",
    ),
    "dim_param on a fixed dim": (
        spec(dims=[sharded_dim(1, {"dim_param": "B", "num_shards": 2})]),
        "dim-param-mismatch",
        "dim_param is 'B' but axis 1 has fixed size 6",
    ),
}


@pytest.mark.parametrize("annotation, code, words", CASES.values(), ids=CASES.keys())
def test_each_structural_error(annotation, code, words):
    diagnostics = validate_model(model(annotation))
    found = only(diagnostics, code)
    assert found.severity == "error"
    assert (found.node, found.op_type, found.tensor) == ("mm0", "MatMul", annotation.tensor_name)
    assert words in found.message
    assert found.hint
    text = str(found)
    assert text.startswith(f"error[{code}] node 'mm0' (MatMul), tensor '{annotation.tensor_name}'")
    with pytest.raises(ShardingError, match=f"error\\[{code}\\] node 'mm0'") as info:
        require_valid(model(annotation))
    assert found in info.value.diagnostics


def test_axis_is_named_where_known():
    found = only(
        validate_model(model(spec(dims=[sharded_dim(2, {"num_shards": 2})]))), "axis-out-of-range"
    )
    assert found.axis == 2
    assert "tensor 'W', axis 2:" in str(found)


def test_unknown_configuration():
    found = only(validate_model(model(spec(), config="dp")), "unknown-configuration")
    assert found.node == "mm0"
    assert "configuration_id 'dp' names no device configuration" in found.message
    assert "['tp']" in found.hint


def test_what_compile_refuses_is_an_error():
    """One verdict: a layout with no NamedSharding is an error for check as for compile."""
    fused_unknown = spec(dims=[sharded_dim(1, {"num_shards": 1}, {"num_shards": 2})])
    found = only(validate_model(model(fused_unknown)), "fused-size-unknown")
    assert found.severity == "error"
    repeated = spec(devices=(0, -1), groups=[(-1, (0, 1))])
    found = only(validate_model(model(repeated)), "device-repeated")
    assert (found.severity, found.tensor) == ("error", "W")
    assert "device 0 holds shards 0 and 1" in found.message
    with pytest.raises(ShardingError):
        require_valid(model(repeated))


def test_every_problem_is_reported_in_one_pass():
    bad = spec(
        "Z",
        devices=(0, 9, -4),
        dims=[sharded_dim(5, {"num_shards": 2}), sharded_dim(5, {"num_shards": 0})],
    )
    codes = [d.code for d in validate_model(model(bad))]
    assert codes == [
        "tensor-not-in-node",
        "axis-repeated",
        "num-shards-invalid",
        "device-out-of-range",
        "group-key-missing",
    ]


def test_two_specs_for_one_tensor():
    found = only(validate_model(model(spec(), spec())), "spec-repeated")
    assert (found.node, found.tensor) == ("mm0", "W")


def test_node_names_of_annotated_nodes():
    m = model(spec())
    second = m.graph.node.add()
    second.CopyFrom(m.graph.node[0])
    second.output[0] = "Y2"
    found = only(validate_model(m), "node-name-repeated")
    assert found.node == "mm0"
    second.name = ""
    found = only(validate_model(m), "node-name-missing")
    assert "node #1 (MatMul) is annotated but has no name" in found.message


def test_configurations():
    m = model(spec())
    m.configuration.add(name="tp", num_devices=2)
    m.configuration.add(name="pp", num_devices=0)
    m.configuration.add(name="dp", num_devices=2, device=["a"])
    m.configuration.add(num_devices=2)
    diagnostics = validate_model(m)
    assert [(d.code, d.message) for d in diagnostics] == [
        ("configuration-repeated", "configuration 'tp' is defined twice"),
        ("configuration-invalid", "configuration 'pp' has num_devices 0"),
        ("configuration-invalid", "configuration 'dp' names 1 devices but num_devices is 2"),
        ("configuration-invalid", "configuration #4 has no name"),
    ]


def test_two_annotations_for_one_configuration():
    m = model(spec())
    m.graph.node[0].device_configurations.add(configuration_id="tp")
    found = only(validate_model(m), "configuration-repeated")
    assert found.node == "mm0"


def test_ranks_come_from_shape_inference():
    # Y's shape is not declared; inference gives [N, 6], so axis 2 is out of range.
    found = only(
        validate_model(model(spec("Y", dims=[sharded_dim(2, {"num_shards": 2})]))),
        "axis-out-of-range",
    )
    assert "shape ['N', 6]" in found.message
