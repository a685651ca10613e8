"""What the pipeline strategy keeps of compile()'s guarantees (issue 19): ``devices=`` is honoured, a stage
with data-dependent output shapes is refused before anything is translated, stage inputs are checked
like a model's, and a model with several configurations needs ``configuration=`` as any compile does.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from jax.sharding import Mesh

import onnx2jax
from onnx2jax.errors import ConfigurationError, NodeError
from onnx2jax.translate import JaxModel
from sharding.annotate import add_configuration, set_stage
from test_segments_sharded import nonzero_then_matmul

PIPELINE = "pp"


def _staged(model: onnx.ModelProto, second: set[str]) -> onnx.ModelProto:
    add_configuration(model, PIPELINE, 2)
    for node in model.graph.node:
        set_stage(model, node.name, 1 if node.name in second else 0, PIPELINE)
    return model


def _two_matmuls() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w0"], ["h"], name="first"),
            onnx.helper.make_node("MatMul", ["h", "w1"], ["y"], name="second"),
        ],
        "two",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["b", 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["b", 4])],
        [
            onnx.numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w0"),
            onnx.numpy_helper.from_array(rng.normal(size=(4, 4)).astype(np.float32), "w1"),
        ],
    )
    return _staged(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), {"second"})


def test_a_data_dependent_stage_is_refused_before_anything_is_translated(monkeypatch) -> None:
    model = _staged(nonzero_then_matmul(), {"nonzero", "rows", "picked", "row"})
    translated = []
    init = JaxModel.__init__
    monkeypatch.setattr(JaxModel, "__init__", lambda self, *a, **k: translated.append(1) or init(self, *a, **k))
    with pytest.raises(NodeError, match=r"node 'nonzero' \(stage 1\): NonZero's output length depends"):
        onnx2jax.compile(model, configuration=PIPELINE)
    assert translated == []


def test_several_configurations_need_one_named() -> None:
    with pytest.raises(ConfigurationError, match=r"device configurations \['\w+', '\w+'\]; choose one"):
        onnx2jax.compile(_staged(nonzero_then_matmul(), {"row"}))


def test_devices_places_each_stage_where_it_says() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    (expected,) = onnx2jax.translate(_two_matmuls())(x)
    for devices in ([0, 1], [1, 0]):
        compiled = onnx2jax.compile(_two_matmuls(), mesh, devices=devices)
        placed = [stage.compiled.mesh.devices.flat[0] for stage in compiled.stages]
        assert placed == [mesh.devices.flat[devices[0]], mesh.devices.flat[devices[1]]]
        (y,) = compiled(x)
        np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-6)


def test_stage_inputs_are_checked_like_a_models() -> None:
    compiled = onnx2jax.compile(_two_matmuls())
    with pytest.raises(TypeError, match=r"input 'x': expected dtype float32, got int32"):
        compiled(np.zeros((2, 4), np.int32))
    with pytest.raises(TypeError, match=r"input 'x': expected rank 2"):
        compiled(np.zeros((2, 4, 1), np.float32))


def test_compile_refuses_an_unknown_configuration_by_the_same_rule() -> None:
    with pytest.raises(ConfigurationError, match=r"configuration 'nope' is not defined in the model; it defines \['\w+', '\w+'\]"):
        onnx2jax.compile(_staged(nonzero_then_matmul(), {"row"}), configuration="nope")
