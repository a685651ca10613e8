"""Small graphs for rule tests (fixture `g`): one node, typed inputs, annotations in the text notation."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sharding import infer
from sharding.model_configs import NodeConfig
from sharding.text import format_spec, parse_spec


def value(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def annotate(node, specs, config="mesh"):
    """Writes ``{tensor: text spec}`` on ``node`` for ``config``."""
    node.device_configurations.append(
        NodeConfig(config, tuple(parse_spec(t, n) for n, t in specs.items())).to_proto()
    )
    return node


def model(nodes, inputs, outputs=None, inits=(), devices=8, opset=18):
    """A model with one configuration ``mesh``; outputs default to the last node's, untyped."""
    if outputs is None:
        outputs = [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in nodes[-1].output]
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.configuration.append(onnx.DeviceConfigurationProto(name="mesh", num_devices=devices))
    return m


def one_node(op, inputs, specs, *, outputs=("Y",), inits=(), opset=18, input_shapes=None, **attrs):
    """Infers a one-node model; ``inputs`` is ``[(name, shape)]`` (shape None: an initializer)."""
    node = helper.make_node(op, [n for n, _ in inputs], list(outputs), name="n", **attrs)
    annotate(node, specs)
    typed = [value(n, s) for n, s in inputs if s is not None]
    return infer(model([node], typed, inits=inits, opset=opset), input_shapes=input_shapes)


def out(result, name="Y"):
    """The output spec of ``name`` in the text notation (None when unknown)."""
    spec = result.tensors.get(name)
    return None if spec is None else format_spec(spec)


def codes(result, severity=None):
    return [d.code for d in result.diagnostics if severity is None or d.severity == severity]


import sys  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def g():
    """This module's helpers (tests import nothing from each other under importlib mode)."""
    return sys.modules[__name__]
