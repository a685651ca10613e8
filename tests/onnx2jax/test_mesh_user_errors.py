"""Issue 24, item 2: a user's mesh with the right device count but a shape the specs cannot use.

The error is short (one line), names a mesh shape and axis order that works, and keeps every
failing spec in its attributes; the mesh it names then runs, against numpy.
"""

import re

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnx2jax
from sharding.mesh.layout import MeshMappingError, MeshPlan, layout_of
from sharding.mesh.mapping import map_specs, suggest_mesh
from sharding.spec import ShardingSpec

PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7)]
EVENS_ODDS = [(0, 2, 4, 6), (1, 3, 5, 7)]


def four_by_two() -> onnx.ModelProto:
    """y = x @ w: w's columns in 4 shards on device pairs, x's rows in 2 on evens and odds (a 4x2 mesh)."""
    rng = np.random.default_rng(0)
    w = onh.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w")
    node = oh.make_node("MatMul", ["x", "w"], ["y"], name="mm")
    config = node.device_configurations.add(configuration_id="tp")
    for spec in (ShardingSpec.split("w", {1: 4}, PAIRS), ShardingSpec.split("x", {0: 2}, EVENS_ODDS)):
        config.sharding_spec.add().CopyFrom(spec.to_proto())
    graph = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 32])],
        [w],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])
    model.configuration.add(name="tp", num_devices=8)
    return model


def test_mapping_names_a_mesh_that_works():
    layouts = {
        "w": layout_of(ShardingSpec.split("w", {1: 4}, PAIRS), (16, 32)),
        "x": layout_of(ShardingSpec.split("x", {0: 2}, EVENS_ODDS), (4, 16)),
    }
    with pytest.raises(MeshMappingError) as raised:
        map_specs(layouts, 8, MeshPlan(("model",), (8,), tuple(range(8))))
    error = raised.value
    assert "\n" not in str(error)
    assert "jax.make_mesh((4, 2), ('model', 'd1'))" in str(error), str(error)
    assert {key for key, _ in error.failures} == {"w", "x"}
    assert error.working.axis_sizes == (4, 2)
    map_specs(layouts, 8, error.working)  # the mesh it names expresses every spec


def test_a_device_order_is_said_as_devices():
    plan = MeshPlan(("a", "b"), (2, 2), (0, 2, 1, 3))  # configuration device 2 at flat position 1
    assert suggest_mesh(plan, ("model",)) == "jax.make_mesh((2, 2), ('model', 'd1')) with devices=[0, 2, 1, 3]"
    assert suggest_mesh(MeshPlan(("a",), (8,), tuple(range(8)))) == "jax.make_mesh((8,), ('d0',))"


def test_compile_on_a_mesh_of_the_wrong_shape_is_short_and_the_named_mesh_runs():
    model = four_by_two()
    with pytest.raises(MeshMappingError) as raised:
        onnx2jax.compile(model, jax.make_mesh((8,), ("model",)))
    message = str(raised.value)
    assert len(message) < 400 and "\n" not in message, message
    shape = re.search(r"jax\.make_mesh\(\(([\d, ]+)\), \(([^)]*)\)\)", message)
    assert shape is not None and "devices=" not in message, message
    sizes = tuple(int(s) for s in shape.group(1).split(",") if s.strip())
    names = tuple(n.strip().strip("'") for n in shape.group(2).split(",") if n.strip())
    assert sizes == (4, 2)
    assert raised.value.failures and "specs the given mesh cannot express" in "".join(raised.value.__notes__)
    x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
    (y,) = onnx2jax.compile(model, jax.make_mesh(sizes, names))(x)
    w = onh.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(np.asarray(y), x @ w, rtol=1e-5, atol=1e-5)
