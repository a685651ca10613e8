"""onnx2jax.compile on 8 fake CPU devices: values against the unsharded run, exact collective counts."""

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from jax.sharding import Mesh, PartitionSpec

import onnx2jax
from onnx2jax.runtime.compile import compile as compile_model
from onnx2jax.runtime.spmd import count_collectives
from sharding.mesh.layout import MeshMappingError
from sharding.diagnostics import ShardingError
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

FLOAT = onnx.TensorProto.FLOAT
EIGHT = tuple(range(8))


class Builder:
    """A small graph with specs written on chosen nodes."""

    def __init__(self, num_devices=8, opset=18):
        self.nodes, self.inits, self.specs = [], [], {}
        self.inputs, self.outputs = [], []
        self.num_devices, self.opset = num_devices, opset
        self.rng = np.random.default_rng(0)

    def input(self, name, shape, dtype=FLOAT):
        self.inputs.append(oh.make_tensor_value_info(name, dtype, shape))

    def output(self, name, shape, dtype=FLOAT):
        self.outputs.append(oh.make_tensor_value_info(name, dtype, shape))

    def weight(self, name, shape, scale=0.3):
        array = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        self.inits.append(onh.from_array(array, name))
        return array

    def const(self, name, array):
        self.inits.append(onh.from_array(np.asarray(array), name))

    def node(self, op, inputs, outputs, specs=(), **attrs):
        name = f"{op.lower()}{len(self.nodes)}"
        self.nodes.append(oh.make_node(op, inputs, outputs, name=name, **attrs))
        if specs:
            self.specs[name] = specs
        return name

    def model(self):
        graph = oh.make_graph(self.nodes, "g", self.inputs, self.outputs, self.inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", self.opset)])
        if self.specs:
            model.configuration.add().CopyFrom(onnx.DeviceConfigurationProto(name="tp", num_devices=self.num_devices))
        for node in model.graph.node:
            for spec in self.specs.get(node.name, ()):
                config = next((c for c in node.device_configurations if c.configuration_id == "tp"), None)
                if config is None:
                    config = node.device_configurations.add()
                    config.configuration_id = "tp"
                config.sharding_spec.add().CopyFrom(spec.to_proto())
        return model


def unsharded(model, *inputs):
    return [np.asarray(o) for o in onnx2jax.translate(model)(*inputs)]


def run_and_count(model, *inputs, mesh=None):
    compiled = compile_model(model, mesh)
    outputs = [np.asarray(o) for o in compiled(*inputs)]
    for got, want in zip(outputs, unsharded(model, *inputs)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
    return compiled, count_collectives(compiled.compiled_text(*inputs))


def only(counts, **expected):
    """The collective counts, with every kind not named expected to be zero."""
    return counts == {kind: expected.get(kind.replace("-", "_"), 0) for kind in counts}


def col(name, axis=1, devices=EIGHT):
    return ShardingSpec.split(name, {axis: len(devices)}, devices)


def row(name, devices=EIGHT):
    return ShardingSpec.split(name, {0: len(devices)}, devices)


def test_megatron_mlp_has_exactly_one_all_reduce():
    b = Builder(opset=20)
    b.input("x", [4, 16])
    b.output("y", [4, 16])
    b.weight("w1", (16, 64))
    b.weight("w2", (64, 16))
    b.node("MatMul", ["x", "w1"], ["h"], [col("w1")])
    b.node("Gelu", ["h"], ["a"])
    b.node("MatMul", ["a", "w2"], ["y"], [row("w2")])
    x = b.rng.standard_normal((4, 16)).astype(np.float32)
    compiled, counts = run_and_count(b.model(), x)
    assert only(counts, all_reduce=1), counts


def test_parameters_are_placed_sharded():
    b = Builder()
    b.input("x", [4, 16])
    b.output("y", [4, 16])
    b.weight("w1", (16, 64))
    b.weight("w2", (64, 16))
    b.weight("bias", (16,))
    b.node("MatMul", ["x", "w1"], ["h"], [col("w1")])
    b.node("Relu", ["h"], ["a"])
    b.node("MatMul", ["a", "w2"], ["p"], [row("w2")])
    b.node("Add", ["p", "bias"], ["y"])
    x = b.rng.standard_normal((4, 16)).astype(np.float32)
    compiled, _ = run_and_count(b.model(), x)
    per_device = compiled.report().param_bytes_per_device
    sharded = (16 * 64 + 64 * 16) * 4
    replicated = 16 * 4
    assert set(per_device) == {d.id for d in jax.devices()[:8]}
    assert set(per_device.values()) == {sharded // 8 + replicated}
    assert compiled.params["w1"].addressable_shards[0].data.shape == (16, 8)


def attention_model(num_heads=8, head_dim=4, seq=6, batch=2):
    hidden = num_heads * head_dim
    b = Builder()
    b.input("x", [batch, seq, hidden])
    b.output("out", [batch, seq, hidden])
    for w in ("wq", "wk", "wv", "wo"):
        b.weight(w, (hidden, hidden))
    b.const("heads", np.array([batch, seq, num_heads, head_dim], np.int64))
    b.const("merged", np.array([batch, seq, hidden], np.int64))
    b.const("scale", np.array(1 / np.sqrt(head_dim), np.float32))
    for proj, w in (("q", "wq"), ("k", "wk"), ("v", "wv")):
        b.node("MatMul", ["x", w], [f"{proj}_flat"], [col(w)])
        b.node("Reshape", [f"{proj}_flat", "heads"], [f"{proj}_4d"])
        perm = [0, 2, 3, 1] if proj == "k" else [0, 2, 1, 3]
        b.node("Transpose", [f"{proj}_4d"], [f"{proj}_h"], perm=perm)
    b.node("MatMul", ["q_h", "k_h"], ["scores"])
    b.node("Mul", ["scores", "scale"], ["scaled"])
    b.node("Softmax", ["scaled"], ["probs"], axis=-1)
    b.node("MatMul", ["probs", "v_h"], ["ctx_h"])
    b.node("Transpose", ["ctx_h"], ["ctx_4d"], perm=[0, 2, 1, 3])
    b.node("Reshape", ["ctx_4d", "merged"], ["ctx"])
    b.node("MatMul", ["ctx", "wo"], ["out"], [row("wo")])
    x = b.rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    return b.model(), x


def test_attention_with_heads_sharded_has_exactly_one_all_reduce():
    model, x = attention_model()
    _, counts = run_and_count(model, x)
    assert only(counts, all_reduce=1), counts


def test_gated_mlp_through_a_fused_axis_has_exactly_one_all_reduce():
    hidden, ffn = 16, 64
    b = Builder()
    b.input("x", [4, hidden])
    b.output("y", [4, hidden])
    b.weight("w_gate_up", (hidden, 2 * ffn))
    b.weight("w_down", (ffn, hidden))
    b.const("sizes", np.array([ffn, ffn], np.int64))
    fused = ShardingSpec(
        "w_gate_up",
        (ShardedDim(1, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(8, dim_value=ffn))),),
        devices=EIGHT,
    )
    b.node("MatMul", ["x", "w_gate_up"], ["gu"], [fused])
    b.node("Split", ["gu", "sizes"], ["gate", "up"], axis=1)
    b.node("Sigmoid", ["gate"], ["sig"])
    b.node("Mul", ["gate", "sig"], ["silu"])
    b.node("Mul", ["silu", "up"], ["act"])
    b.node("MatMul", ["act", "w_down"], ["y"], [row("w_down")])
    x = b.rng.standard_normal((4, hidden)).astype(np.float32)
    compiled, counts = run_and_count(b.model(), x)
    assert only(counts, all_reduce=1), counts
    # The fused weight is held unfused, each device with its own F/8 columns of gate and of up.
    assert compiled.params["w_gate_up"].shape == (hidden, 2, ffn)
    assert compiled.params["w_gate_up"].addressable_shards[0].data.shape == (hidden, 2, ffn // 8)


def test_proposal_0007_broadcast_composition_places_shard_ij_on_device_2i_plus_j():
    b = Builder(num_devices=4)
    b.input("a", [4, 1])
    b.input("b", [1, 6])
    b.output("c", [4, 6])
    b.node(
        "Add",
        ["a", "b"],
        ["c"],
        [ShardingSpec.split("a", {0: 2}, [(0, 1), (2, 3)]), ShardingSpec.split("b", {1: 2}, [(0, 2), (1, 3)]), ShardingSpec.split("c", {0: 2, 1: 2}, range(4))],
    )
    a = np.arange(4, dtype=np.float32).reshape(4, 1)
    bb = 10 * np.arange(6, dtype=np.float32).reshape(1, 6)
    compiled, counts = run_and_count(b.model(), a, bb)
    assert only(counts), counts
    (c,) = compiled(a, bb)
    devices = jax.devices()
    for shard in c.addressable_shards:
        i = shard.index[0].start // 2
        j = shard.index[1].start // 3
        assert shard.device == devices[2 * i + j]
        np.testing.assert_array_equal(np.asarray(shard.data), (a + bb)[shard.index])


def test_replication_groups_of_proposal_0006():
    """[[1,2],[3,4]], axis 0 in 2 shards on groups {0,1} and {2,3}: devices 0,1 hold [[1,2]], 2,3 hold [[3,4]]."""
    b = Builder(num_devices=4)
    b.input("x", [2, 2])
    b.output("y", [2, 2])
    spec = ShardingSpec.split("y", {0: 2}, [(0, 1), (2, 3)])
    b.node("Identity", ["x"], ["y"], [spec])
    x = np.array([[1, 2], [3, 4]], np.float32)
    compiled, _ = run_and_count(b.model(), x)
    (y,) = compiled(x)
    held = {shard.device.id: np.asarray(shard.data).tolist() for shard in y.addressable_shards}
    d = [dev.id for dev in jax.devices()[:4]]
    assert held == {d[0]: [[1, 2]], d[1]: [[1, 2]], d[2]: [[3, 4]], d[3]: [[3, 4]]}


def test_output_reshard_to_replicated_is_one_all_gather():
    b = Builder()
    b.input("x", [8, 4])
    b.output("y", [8, 4])
    b.weight("w", (8, 4))
    b.node("Mul", ["x", "w"], ["p"], [row("x"), row("w"), row("p")])
    b.node("Relu", ["p"], ["y"], [row("p"), ShardingSpec.replicated("y", EIGHT)])
    x = b.rng.standard_normal((8, 4)).astype(np.float32)
    _, counts = run_and_count(b.model(), x)
    assert only(counts, all_gather=1), counts


def test_user_mesh_data_and_model_parallel():
    b = Builder()
    b.input("x", [4, 16])
    b.output("y", [4, 16])
    b.weight("w1", (16, 32))
    b.weight("w2", (32, 16))
    batch = lambda name: ShardingSpec.split(name, {0: 2}, [(0, 1, 2, 3), (4, 5, 6, 7)])  # noqa: E731
    model_axis = lambda name, axis: ShardingSpec.split(name, {axis: 4}, [(0, 4), (1, 5), (2, 6), (3, 7)])  # noqa: E731
    both = lambda name: ShardingSpec(  # noqa: E731
        name, (ShardedDim(0, (SimpleShardedDim(2),)), ShardedDim(1, (SimpleShardedDim(4),))), devices=EIGHT
    )
    b.node("MatMul", ["x", "w1"], ["h"], [batch("x"), model_axis("w1", 1), both("h")])
    b.node("MatMul", ["h", "w2"], ["y"], [both("h"), model_axis("w2", 0), batch("y")])
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    x = b.rng.standard_normal((4, 16)).astype(np.float32)
    compiled, counts = run_and_count(b.model(), x, mesh=mesh)
    assert compiled.mesh is mesh
    assert compiled.params["w1"].sharding.spec == PartitionSpec(None, "model")
    assert only(counts, all_reduce=1), counts


def test_uneven_weight_shards_run_correctly_and_are_stored_padded():
    b = Builder(num_devices=4)
    b.input("x", [3, 10])
    b.output("y", [3, 6])
    b.weight("w", (10, 6))
    b.node("MatMul", ["x", "w"], ["y"], [ShardingSpec.split("w", {0: 4}, range(4)), ShardingSpec.replicated("y", range(4))])
    x = b.rng.standard_normal((3, 10)).astype(np.float32)
    compiled, _ = run_and_count(b.model(), x)
    assert compiled.params["w"].shape == (12, 6)
    assert compiled.params["w"].addressable_shards[0].data.shape == (3, 6)
    np.testing.assert_array_equal(np.asarray(compiled.logical_params["w"]), onh.to_array(b.inits[0]))


def test_uneven_output_spec_warns_instead_of_replicating_silently():
    b = Builder(num_devices=4)
    b.input("x", [10, 3])
    b.output("y", [10, 3])
    b.node("Relu", ["x"], ["y"], [ShardingSpec.split("y", {0: 4}, range(4))])
    x = b.rng.standard_normal((10, 3)).astype(np.float32)
    compiled = compile_model(b.model())
    # 10 rows over 4 devices, and 3 columns: no axis divides, so it comes back replicated, and says so
    with pytest.warns(UserWarning, match=r"'y' \[10, 3\]: its spec splits axis 0 \(10\) .* do not divide it evenly"
                      r".* no other axis divides evenly, so it comes back replicated$"):
        (y,) = compiled(x)
    np.testing.assert_array_equal(np.asarray(y), np.maximum(x, 0))
    assert all(s.data.shape == (10, 3) for s in y.addressable_shards)


def test_inexpressible_specs_are_named():
    b = Builder(num_devices=4)
    b.input("x", [4])
    b.output("y", [4])
    b.node("Relu", ["x"], ["h"], [ShardingSpec.split("h", {0: 4}, range(4))])
    b.node("Neg", ["h"], ["y"], [ShardingSpec.split("y", {0: 2}, [(0, 3), (1, 2)])])
    with pytest.raises(MeshMappingError, match=r"(?s)node 'neg1' output 0 \('y'\).*\{0,3\}, \{1,2\}"):
        compile_model(b.model())


def test_invalid_annotations_are_refused_with_every_error():
    b = Builder()
    b.input("x", [4, 16])
    b.output("y", [4, 8])
    b.weight("w", (16, 8))
    b.node("MatMul", ["x", "w"], ["y"], [ShardingSpec.split("x", {1: 8}, EIGHT), ShardingSpec.split("w", {1: 8}, EIGHT)])
    with pytest.raises(ShardingError, match="matmul0"):
        compile_model(b.model())


def test_random_specs_on_small_graphs_give_unsharded_values():
    rng = np.random.default_rng(42)
    for trial in range(6):
        b = Builder()
        shape = [8, 4 * int(rng.integers(1, 3))]
        b.input("x", shape)
        b.output("y", [shape[0], 8])
        b.weight("w", (shape[1], 8))
        b.weight("bias", (1, 8))
        axis = int(rng.integers(0, 2))
        ways = int(rng.choice([2, 4, 8]))
        devices = tuple(int(d) for d in rng.permutation(8)[:ways])
        spec_x = ShardingSpec.split("x", {axis: ways}, devices)
        b.node("Tanh", ["x"], ["t"], [spec_x])
        b.node("MatMul", ["t", "w"], ["m"])
        b.node("Add", ["m", "bias"], ["s"])
        b.node("ReduceSum", ["s", "axes"], ["r"], keepdims=1)
        b.const("axes", np.array([1], np.int64))
        b.node("Sub", ["s", "r"], ["y"])
        x = rng.standard_normal(shape).astype(np.float32)
        run_and_count(b.model(), x)


def test_sharded_jax_array_inputs_are_used_as_they_are():
    b = Builder()
    b.input("x", [8, 16])
    b.output("y", [8, 16])
    b.weight("w1", (16, 64))
    b.weight("w2", (64, 16))
    b.node("MatMul", ["x", "w1"], ["h"], [row("x"), ShardingSpec.replicated("w1", EIGHT)])
    b.node("MatMul", ["h", "w2"], ["y"])
    model = b.model()
    compiled = compile_model(model)
    x = b.rng.standard_normal((8, 16)).astype(np.float32)
    placed = jax.device_put(x, jax.sharding.NamedSharding(compiled.mesh, PartitionSpec("d0", None)))
    (y,) = compiled(placed)
    np.testing.assert_allclose(np.asarray(y), unsharded(model, x)[0], rtol=2e-5, atol=2e-5)
    assert only(count_collectives(compiled.compiled_text(placed))), "a batch-sharded input needs no collective"


def test_reshape_chains_with_random_specs_give_unsharded_values():
    rng = np.random.default_rng(3)
    for trial in range(4):
        b = Builder()
        b.input("x", [4, 8, 6])
        b.output("y", [4, 2, 24])
        b.const("to3", np.array([4, 48], np.int64))
        b.const("back", np.array([4, 2, 24], np.int64))
        axis = int(rng.integers(0, 3))
        ways = int(rng.choice([2, 4]))
        devices = tuple(int(d) for d in rng.permutation(8)[:ways])
        b.node("Relu", ["x"], ["r"], [ShardingSpec.split("x", {axis: ways}, devices)])
        b.node("Reshape", ["r", "to3"], ["flat"])
        b.node("Softmax", ["flat"], ["soft"], axis=-1)
        b.node("Reshape", ["soft", "back"], ["y"])
        x = rng.standard_normal((4, 8, 6)).astype(np.float32)
        run_and_count(b.model(), x)


def test_spec_on_some_devices_runs_replicated_on_the_others_and_says_so():
    b = Builder()
    b.input("x", [8, 6])
    b.output("y", [8, 6])
    b.node("Relu", ["x"], ["h"], [ShardingSpec.split("h", {0: 2}, [0, 1])])
    b.node("Neg", ["h"], ["y"], [ShardingSpec.split("y", {0: 8}, EIGHT)])
    x = b.rng.standard_normal((8, 6)).astype(np.float32)
    compiled, _ = run_and_count(b.model(), x)
    notes = compiled.report().notes
    assert any("'relu0' output 0 ('h')" in n and "devices [2, 3, 4, 5, 6, 7] hold replicas" in n for n in notes), notes
