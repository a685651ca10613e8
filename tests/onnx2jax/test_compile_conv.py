"""A channel-parallel CNN block on 8 devices: exact collectives against the unsharded run.

conv1 (column: output channels split) -> Relu -> grouped conv2 (the split keeps whole
groups: local) -> BatchNormalization (per-channel, local) -> conv3 (row: input channels are
a reduction, one all-reduce) -> MaxPool (channels free). Only the parameters and conv3's
output carry specs; inference places the rest.

XLA's SPMD partitioner (jax 0.10) keeps a depthwise conv (one channel per group) local
when its channels are split, but gathers a grouped conv whose groups hold several
channels (docs/known-issues.md); the runtime computes that one batched over its groups
(`onnx2jax.ops.conv.conv_by_groups`), which stays local.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding import ShardingError
from sharding.annotate import add_configuration, set_spec
from sharding.spec import ShardingSpec

N = 8
RNG = np.random.default_rng(0)


def _init(name, *shape):
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32) * 0.3, name)


def _block(group: int = 16, spatial_split: bool = False) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", group=group, pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c2", "s", "b", "mean", "var"], ["n2"], name="bn"),
        helper.make_node("Conv", ["n2", "w3"], ["c3"], name="conv3"),
        helper.make_node("MaxPool", ["c3"], ["y"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    inits = [
        _init("w1", 16, 4, 3, 3), _init("w2", 16, 16 // group, 3, 3), _init("b2", 16), _init("s", 16),
        _init("b", 16), _init("mean", 16), _init("w3", 8, 16, 1, 1),
        numpy_helper.from_array(RNG.uniform(0.5, 1.5, 16).astype(np.float32), "var"),
    ]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    add_configuration(model, "tp", N)
    devices = range(N)
    set_spec(model, "conv1", ShardingSpec.split("w1", {0: N}, devices), "tp")
    set_spec(model, "conv2", ShardingSpec.split("w2", {0: N}, devices), "tp")
    set_spec(model, "conv2", ShardingSpec.split("b2", {0: N}, devices), "tp")
    for name in ("s", "b", "mean", "var"):
        set_spec(model, "bn", ShardingSpec.split(name, {0: N}, devices), "tp")
    set_spec(model, "conv3", ShardingSpec.split("w3", {1: N}, devices), "tp")
    set_spec(model, "conv3", ShardingSpec.replicated("c3", devices), "tp")
    if spatial_split:
        set_spec(model, "conv1", ShardingSpec.split("x", {2: 2}, [range(0, 4), range(4, 8)]), "tp")
    return model


@pytest.mark.parametrize("group", [16, 8])
def test_channel_parallel_block_has_one_all_reduce_and_matches(group):
    model = _block(group)
    x = RNG.standard_normal((2, 4, 8, 8)).astype(np.float32)
    compiled = onnx2jax.compile(model)
    (y,) = compiled(x)
    (unsharded,) = onnx2jax.translate(model)(x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(unsharded), rtol=1e-5, atol=1e-5)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5)
    counts = count_collectives(compiled.compiled_text(x))
    assert counts == {"all-reduce": 1, "all-gather": 0, "all-to-all": 0, "collective-permute": 0,
                      "reduce-scatter": 0}
    params = compiled.report(x).param_bytes_per_device
    whole = 4 * (16 * 4 * 9 + 16 * (16 // group) * 9 + 16 * 5 + 8 * 16)
    assert set(params.values()) == {whole // N}  # every parameter is split 8 ways


def test_a_channel_split_that_cuts_groups_is_refused_by_name():
    """4 groups of 4 channels cannot be cut 8 ways without splitting a group."""
    with pytest.raises(ShardingError) as caught:
        onnx2jax.compile(_block(group=4))
    assert "group-split" in {d.code for d in caught.value.diagnostics}


def test_a_spatial_split_is_refused_by_name():
    with pytest.raises(ShardingError) as caught:
        onnx2jax.compile(_block(spatial_split=True))
    found = [(d.code, d.node, d.tensor, d.axis) for d in caught.value.diagnostics]
    assert ("spatial-axis-sharded", "conv1", "x", 2) in found
