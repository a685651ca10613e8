"""Graph inputs and outputs of a sharded run: inputs of any spec run, outputs come back as their spec says.

Outputs come back exactly as their spec says, or replicated with a warning;
never in a layout XLA chose.
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


def test_each_output_sharded_as_its_spec_or_replicated_with_a_warning():
    b = Builder()
    b.input("x", [8, 12])
    for name in ("even", "uneven", "none", "fused", "cols"):
        b.output(name, [8, 12])
    even = ShardingSpec.split("even", {0: 4, 1: 2}, [5, 1, 4, 0, 6, 3, 7, 2])
    uneven = ShardingSpec.split("uneven", {1: 8}, [5, 1, 4, 0, 6, 3, 7, 2])
    fused = ShardingSpec("fused", (ShardedDim(1, (SimpleShardedDim(2, dim_value=2), SimpleShardedDim(2, dim_value=6))),), devices=(5, 1, 4, 0))
    cols = ShardingSpec.split("cols", {1: 4}, [(5, 1), (6, 3), (4, 0), (7, 2)])  # a transposed reading of even's order
    b.node("Relu", ["x"], ["even"], [even])
    b.node("Neg", ["x"], ["uneven"], [uneven])
    b.node("Abs", ["x"], ["none"])  # no spec on the path at all
    b.node("Sigmoid", ["x"], ["fused"], [fused])
    b.node("Tanh", ["x"], ["cols"], [cols])
    x = np.random.default_rng(0).standard_normal((8, 12)).astype(np.float32)
    outputs, warned = _outputs(b.model(), x)
    assert_placed(outputs[0], even, np.maximum(x, 0))
    assert_placed(outputs[1], None, -x)
    assert_placed(outputs[2], None, np.abs(x))
    assert_placed(outputs[3], None, 1 / (1 + np.exp(-x)))
    assert_placed(outputs[4], cols, np.tanh(x))
    assert any("'uneven'" in w and "does not divide" in w and "replicated" in w for w in warned), warned
    assert any("'fused'" in w and "fuses an axis" in w and "replicated" in w for w in warned), warned
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
