"""sharding.check: structural validation and op rules, every problem in one pass."""

import onnx
from onnx import TensorProto, helper

from sharding import check
from sharding.megatron import megatron_plan
from sharding.model_configs import NodeConfig
from sharding.text import parse_spec


def annotate(node, specs):
    node.device_configurations.append(
        NodeConfig("mesh", tuple(parse_spec(t, n) for n, t in specs.items())).to_proto())
    return node


def two_problems():
    """One structural error (device 9 of 4) and one rule error (K mismatch)."""
    nodes = [
        annotate(helper.make_node("Relu", ["X"], ["A"], name="act"), {"X": "0:2 @ [0,9]"}),
        annotate(helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm"),
                 {"A": "1:2 @ [0,1]", "W": "1:2 @ [0,1]"}),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 8]),
         helper.make_tensor_value_info("W", TensorProto.FLOAT, [8, 6])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 6])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.configuration.append(onnx.DeviceConfigurationProto(name="mesh", num_devices=4))
    return m


def test_every_problem_in_one_pass():
    diags = check(two_problems())
    errors = [(d.code, d.node) for d in diags if d.severity == "error"]
    assert ("device-out-of-range", "act") in errors
    assert ("k-sharding-mismatch", "mm") in errors
    mm = next(d for d in diags if d.code == "k-sharding-mismatch")
    assert mm.op_type == "MatMul" and mm.tensor == "W" and mm.axis == 0
    assert mm.given == "1:2 @ [0,1]" and mm.hint


def test_valid_megatron_annotations_have_no_errors():
    model = megatron_plan(onnx.load(__import__("pathlib").Path(__file__).parents[1] / "data" / "tiny_bert.onnx"), 8)
    diags = check(model)
    assert [d for d in diags if d.severity != "note"] == []
    assert {d.code for d in diags} == {"collective"}


def test_unsupported_on_request_is_an_error():
    node = annotate(helper.make_node("LRN", ["X"], ["Y"], name="pool", size=3),
                    {"X": "0:2 @ [0,1]"})
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3, 8])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.configuration.append(onnx.DeviceConfigurationProto(name="mesh", num_devices=2))
    assert [d.severity for d in check(m) if d.code == "unsupported-op"] == ["warning"]
    assert [d.severity for d in check(m, unsupported="error") if d.code == "unsupported-op"] == ["error"]
