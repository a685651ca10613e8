"""Meshes as JAX users make them: Explicit axes (jax.make_mesh's default), Auto axes, jax.set_mesh.

Each run is compared with the unsharded run (onnx2jax.translate) and its
collectives are counted exactly in the compiled HLO.
"""

from pathlib import Path

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding.megatron import megatron_plan
from sharding.spec import ShardingSpec

DATA = Path(__file__).resolve().parents[1] / "data"
EIGHT = tuple(range(8))


def megatron_mlp() -> onnx.ModelProto:
    """y = gelu(x @ w1) @ w2, w1 split by columns and w2 by rows over 8 devices: one all-reduce."""
    rng = np.random.default_rng(0)
    w1 = onh.from_array((rng.standard_normal((16, 64)) * 0.3).astype(np.float32), "w1")
    w2 = onh.from_array((rng.standard_normal((64, 16)) * 0.3).astype(np.float32), "w2")
    nodes = [
        oh.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        oh.make_node("Gelu", ["h"], ["a"], name="act"),
        oh.make_node("MatMul", ["a", "w2"], ["y"], name="down"),
    ]
    for node, spec in ((nodes[0], ShardingSpec.split("w1", {1: 8}, EIGHT)), (nodes[2], ShardingSpec.split("w2", {0: 8}, EIGHT))):
        node.device_configurations.add(configuration_id="tp").sharding_spec.add().CopyFrom(spec.to_proto())
    graph = oh.make_graph(
        nodes,
        "mlp",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16])],
        [w1, w2],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])
    model.configuration.add(name="tp", num_devices=8)
    return model


X = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
ONE_ALL_REDUCE = {"all-reduce": 1, "all-gather": 0, "all-to-all": 0, "collective-permute": 0, "reduce-scatter": 0}


def check_against_unsharded(compiled, model, *inputs, **named):
    (want,) = [np.asarray(o) for o in onnx2jax.translate(model)(*inputs, **named)]
    (got,) = compiled(*inputs, **named)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)
    return got


@pytest.mark.parametrize("axis_type", [AxisType.Explicit, AxisType.Auto], ids=["explicit", "auto"])
def test_a_user_mesh_with_explicit_or_auto_axes(axis_type):
    model = megatron_mlp()
    mesh = jax.make_mesh((8,), ("model",), axis_types=(axis_type,))
    compiled = onnx2jax.compile(model, mesh)
    assert compiled.mesh.axis_names == ("model",) and list(compiled.mesh.devices.flat) == list(mesh.devices.flat)
    assert compiled.mesh.axis_types == (AxisType.Auto,)
    check_against_unsharded(compiled, model, X)
    assert count_collectives(compiled.compiled_text(X)) == ONE_ALL_REDUCE
    assert compiled.params["w1"].sharding.spec == PartitionSpec(None, "model")


def test_jax_make_mesh_default_is_explicit_and_is_accepted():
    mesh = jax.make_mesh((8,), ("model",))  # Explicit axes by default since jax 0.9
    assert mesh.axis_types == (AxisType.Explicit,)
    model = megatron_mlp()
    check_against_unsharded(onnx2jax.compile(model, mesh), model, X)


def test_mesh_none_inside_set_mesh_uses_that_mesh():
    model = megatron_mlp()
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    with jax.set_mesh(mesh):
        compiled = onnx2jax.compile(model)
        got = check_against_unsharded(compiled, model, X)  # called inside the Explicit context too
        text = compiled.compiled_text(X)
    assert compiled.mesh.axis_names == ("data", "model") and compiled.mesh.devices.shape == (2, 4)
    assert list(compiled.mesh.devices.flat) == list(mesh.devices.flat)
    assert count_collectives(text) == ONE_ALL_REDUCE
    assert got.sharding.mesh.axis_names == ("data", "model")


def test_inputs_sharded_on_an_explicit_mesh_are_taken_as_they_are():
    model = megatron_mlp()
    mesh = jax.make_mesh((8,), ("model",))
    compiled = onnx2jax.compile(model, mesh)
    x = jax.device_put(X, NamedSharding(mesh, PartitionSpec(None, "model")))
    check_against_unsharded(compiled, model, x)
    with jax.set_mesh(mesh):
        check_against_unsharded(compiled, model, x)


@pytest.mark.slow  # about a minute on 2 shared cores
def test_tiny_llama_on_jax_make_mesh_has_the_five_all_reduces_of_the_demo():
    model = megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8)
    inputs = dict(np.load(DATA / "tiny_llama.inputs.npz"))
    mesh = jax.make_mesh((8,), ("model",))
    compiled = onnx2jax.compile(model, mesh)
    check_against_unsharded(compiled, model, **inputs)
    assert count_collectives(compiled.compiled_text(**inputs)) == {**ONE_ALL_REDUCE, "all-reduce": 5}
