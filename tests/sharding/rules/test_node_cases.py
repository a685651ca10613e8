"""Every rule on ONNX's own single-node test models, with an input split in two: no rule fails."""

import warnings

import onnx

from sharding import infer
from sharding.rules import rule_for
from sharding.model_configs import NodeConfig
from sharding.spec import ShardingSpec


def _cases():
    import onnx.backend.test.case.node as node_cases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [c for c in node_cases.collect_testcases(None) if len(c.model.graph.node) == 1]


def _split_first_even_axis(model):
    """Annotates the node's first two inputs, each split in 2 on its first even axis."""
    node = model.graph.node[0]
    node.name = node.name or "n"
    typed = {i.name: i.type.tensor_type.shape.dim for i in model.graph.input}
    specs = []
    for name in list(node.input)[:2]:
        for axis, dim in enumerate(typed.get(name, ())):
            if dim.dim_value >= 2 and dim.dim_value % 2 == 0:
                specs.append(ShardingSpec.split(name, {axis: 2}, [0, 1]))
                break
    if not specs:
        return False
    del node.device_configurations[:]
    node.device_configurations.append(NodeConfig("mesh", tuple(specs)).to_proto())
    model.configuration.append(onnx.DeviceConfigurationProto(name="mesh", num_devices=2))
    return True


def test_no_rule_fails_on_onnx_node_cases():
    tried, failed = 0, []
    for case in _cases():
        model = case.model
        if rule_for(model.graph.node[0].op_type) is None or not _split_first_even_axis(model):
            continue
        tried += 1
        result = infer(model)
        failed += [f"{case.name}: {d}" for d in result.diagnostics if d.code == "rule-failed"]
    assert tried > 400
    assert failed == []
