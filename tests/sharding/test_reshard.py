"""sharding.reshard: which collective turns one spec into another."""

import pytest

from sharding.reshard import reshard_kind, same_spec
from sharding.text import parse_spec


@pytest.mark.parametrize(
    "src, dst, shape, kind",
    [
        ("1:2 @ [0,1]", "1:2 @ [0,1]", (4, 4), None),
        ("1:(4x4,2x1) @ [0,1,2,3]", "1:4 @ [0,1,2,3]", (2, 8), None),  # fused = plain (DESIGN 5)
        ("-1:2 @ [0,1]", "1:2 @ [0,1]", (4, 4), None),
        ("1:2 @ [0,1]", "replicated @ [{0,1}]", (4, 4), "all-gather"),
        ("replicated @ [{0,1}]", "0:2 @ [0,1]", (4, 4), "dynamic-slice"),
        ("0:2 @ [0,1]", "1:2 @ [0,1]", (4, 4), "all-to-all"),
        ("0:2 @ [0,1]", "0:2 @ [1,0]", (4, 4), "collective-permute"),
        ("0:2 @ [0,1]", "0:2 @ [{0,2},{1,3}]", (4, 4), "broadcast"),
        # finer blocks, each on devices holding the coarse block it lies in (GQA's kv groups -> query heads)
        ("2:2 @ [{0,1,2,3},{4,5,6,7}]", "2:8 @ [0,1,2,3,4,5,6,7]", (1, 3, 128), "dynamic-slice"),
        ("2:2 @ [{0,2,4,6},{1,3,5,7}]", "2:8 @ [0,1,2,3,4,5,6,7]", (1, 3, 128), "all-to-all"),
    ],
)
def test_reshard_kind(src, dst, shape, kind):
    assert reshard_kind(parse_spec(src, "t"), parse_spec(dst, "t"), shape) == kind


def test_same_spec_without_shape_compares_structure():
    assert same_spec(parse_spec("0:2 @ [0,1]", "a"), parse_spec("0:2 @ [0,1]", "b"), None)
    assert not same_spec(parse_spec("0:2 @ [0,1]", "a"), parse_spec("0:2 @ [1,0]", "a"), None)


def test_written_output_moved_to_another_axis_is_an_all_to_all():
    import onnx
    from onnx import TensorProto, helper

    from sharding import infer
    from sharding.model_configs import NodeConfig

    node = helper.make_node("Relu", ["X"], ["Y"], name="relu")
    node.device_configurations.append(NodeConfig("mesh", (parse_spec("0:2 @ [0,1]", "X"),
                                                          parse_spec("1:2 @ [0,1]", "Y"))).to_proto())
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [4, 4])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [4, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.configuration.append(onnx.DeviceConfigurationProto(name="mesh", num_devices=2))
    [note] = infer(model).diagnostics
    assert note.code == "reshard" and note.message.endswith("(all-to-all)")
    assert (note.given, note.expected) == ("1:2 @ [0,1]", "0:2 @ [0,1]")
