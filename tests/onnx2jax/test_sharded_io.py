"""Graph inputs and outputs of a sharded run: inputs of any spec run, outputs come back as their spec says.

Outputs come back exactly as their spec says, or, where JAX cannot hold the spec (uneven, fused), split
on another axis or replicated with a warning that says which; never in a layout XLA chose.
"""

import warnings

import numpy as np
import pytest
from placement import assert_placed
from test_compile import Builder, compile_model, unsharded

from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim


def _outputs(model, *inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = compile_model(model)(*inputs)
    return outputs, [str(w.message) for w in caught]


def test_each_output_sharded_as_its_spec_or_moved_with_a_warning():
    b = Builder()
    b.input("x", [8, 12])
    for name in ("even", "uneven", "none", "fused", "cols"):
        b.output(name, [8, 12])
    even = ShardingSpec.split("even", {0: 4, 1: 2}, [5, 1, 4, 0, 6, 3, 7, 2])
    uneven = ShardingSpec.split("uneven", {1: 8}, [5, 1, 4, 0, 6, 3, 7, 2])
    # columns as [3, 4], the 4 cut 4 ways: each device holds 3 columns 4 apart, no tile of the ONNX tensor
    fused = ShardingSpec("fused", (ShardedDim(1, (SimpleShardedDim(1, dim_value=3), SimpleShardedDim(4, dim_value=4))),), devices=(5, 1, 4, 0))
    cols = ShardingSpec.split("cols", {1: 4}, [(5, 1), (6, 3), (4, 0), (7, 2)])  # a transposed reading of even's order
    b.node("Relu", ["x"], ["even"], [even])
    b.node("Neg", ["x"], ["uneven"], [uneven])
    b.node("Abs", ["x"], ["none"])  # no spec on the path at all
    b.node("Sigmoid", ["x"], ["fused"], [fused])
    b.node("Tanh", ["x"], ["cols"], [cols])
    x = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    outputs, warned = _outputs(b.model(), x)
    assert_placed(outputs[0], even, np.maximum(x, 0))
    # JAX holds neither 12 columns over 8 nor a fused axis: their mesh axes move to the rows, which they
    # divide, in the same device order (block k of the rows where block k of the columns was)
    assert_placed(outputs[1], ShardingSpec.split("uneven", {0: 8}, [5, 1, 4, 0, 6, 3, 7, 2]), -x)
    assert_placed(outputs[2], None, np.abs(x))
    assert_placed(outputs[3], ShardingSpec.split("fused", {0: 4}, [5, 1, 4, 0]), 1 / (1 + np.exp(-x)))
    assert_placed(outputs[4], cols, np.tanh(x))
    assert any("'uneven'" in w and "do not divide it evenly" in w and "split on axis 0 instead" in w for w in warned)
    assert any("'fused'" in w and "fused, so that its shards are not tiles" in w and "split on axis 0" in w for w in warned)
    assert not any("'even'" in w or "'none'" in w or "'cols'" in w for w in warned), warned


def test_an_output_replicated_by_its_spec_is_replicated_on_every_device():
    b = Builder()
    b.input("x", [8, 4])
    b.output("y", [8, 4])
    b.node("Relu", ["x"], ["h"], [ShardingSpec.split("h", {0: 8}, range(8))])
    b.node("Neg", ["h"], ["y"], [ShardingSpec.replicated("y", range(8))])
    x = np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)
    (y,), warned = _outputs(b.model(), x)
    assert_placed(y, None, -np.maximum(x, 0))
    assert not warned


@pytest.mark.parametrize("rows", [2, 12])
def test_graph_input_split_unevenly_over_eight_devices_runs(rows):
    b = Builder()
    b.input("x", [rows, 4])
    b.output("y", [rows, 4])
    b.node("Relu", ["x"], ["h"], [ShardingSpec.split("x", {0: 8}, range(8))])
    b.node("Neg", ["h"], ["y"], [ShardingSpec.replicated("y", range(8))])
    x = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
    model = b.model()
    (y,), warned = _outputs(model, x)
    assert_placed(y, None, unsharded(model, x)[0])
    assert not warned


@pytest.mark.parametrize(
    ("shape", "spec", "fused", "held", "says"),
    [
        # GPT-2's logits at TP 4 x DP 2: the vocabulary's mesh axis moves to the sequence
        ((2, 128, 50257), ("dp", None, "tp"), (), ("dp", "tp", None), "split on axis 1 instead"),
        # a batch that both mesh axes divide is the first axis that fits
        ((8, 128, 50257), (None, None, ("dp", "tp")), (), (("dp", "tp"), None, None), "split on axis 0 instead"),
        # with the axes already on it: 'tp' joins 'dp' on the batch (8 = 2 x 4)
        ((8, 3, 50257), ("dp", None, "tp"), (), (("dp", "tp"), None, None), "split on axis 0 instead"),
        # one decode token: no axis divides, the vocabulary's mesh axis replicates, the batch keeps its split
        ((2, 1, 50257), ("dp", None, "tp"), (), ("dp", None, None), "replicated over those mesh axes"),
        ((1, 1, 50257), (None, None, "tp"), (), (None, None, None), "no other axis divides evenly, so it comes back replicated"),
        # a fused axis split on its leading sub-axis only is a plain split of the axis
        ((6, 8), (None, "tp", None), ((1, (4, 2)),), (None, "tp"), None),
        # split on an inner sub-axis its shards are not tiles: the mesh axis moves
        ((8, 8), (None, None, "tp"), ((1, (2, 4)),), ("tp", None), "not tiles of the ONNX tensor"),
    ],
)
def test_what_an_output_jax_cannot_hold_comes_back_as(shape, spec, fused, held, says):
    """``holdable_output``: the mesh axes of an axis JAX cannot hold move together to the first axis they
    divide evenly, else replicate; the other axes keep their spec; the warning says which."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from onnx2jax.runtime.placement_keys import TensorPlacement
    from onnx2jax.runtime.placements import holdable_output

    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))
    named, why = holdable_output(shape, TensorPlacement(NamedSharding(mesh, PartitionSpec(*spec)), fused))
    assert tuple(named.spec) + (None,) * (len(shape) - len(named.spec)) == held
    assert (why is None) if says is None else (says in why), why
