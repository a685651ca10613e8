"""A fused axis split on its leading sub-axis only: a plain split when that sub-axis divides, else not (issue 40).

``[{1, 2 shards}, {5, 1 shard}]`` on an axis of 5 puts all 5 elements on the first device and nothing on the
second (the sub-axis of size 1 is cut in blocks of ceil(1/2) = 1). The runtime read any fused axis whose only
split sub-axis is the leading one as a plain split of the whole axis, and asked JAX to return the output as
``P('d0')`` on 5 elements: ``IndivisibleError`` at the first call (the three specs of issue 40), or, where the
axis divides but the sub-axis does not (``[{3, 2 shards}, {2, 1 shard}]`` on 6: blocks [0, 4) and [4, 6)),
an output silently placed [0, 3) and [3, 6). Each case here runs and is compared with numpy and the unsharded
run; where JAX cannot hold the spec the output comes back replicated with a warning that says so, and where it
can (the sub-axis divides) it comes back placed as the spec says, element by element (``sharding.tiles``).
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from placement import assert_placed

import onnx2jax
import sharding
from sharding.annotate import add_configuration, set_spec
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

FLOAT = onnx.TensorProto.FLOAT


def _fused(name: str, axis: int, parts: list[tuple[int, int]], devices, groups=()) -> ShardingSpec:
    """A spec with one fused axis: ``parts`` are (dim_value, num_shards), outermost first."""
    dims = (ShardedDim(axis, tuple(SimpleShardedDim(n, dim_value=v) for v, n in parts)),)
    return ShardingSpec(name, dims, tuple(devices), tuple(groups))


def _model(nodes, inputs, outputs, inits, specs, num_devices) -> onnx.ModelProto:
    graph = oh.make_graph(nodes, "g", inputs, outputs, inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    model.ir_version = 10
    add_configuration(model, "tp", num_devices)
    for node, spec in specs:
        set_spec(model, node, spec, "tp")
    return model


def _abs(shape: list[int], spec: ShardingSpec, num_devices: int) -> onnx.ModelProto:
    return _model(
        [oh.make_node("Abs", ["in2"], ["out"], name="abs0")],
        [oh.make_tensor_value_info("in2", FLOAT, shape)],
        [oh.make_tensor_value_info("out", FLOAT, shape)],
        [],
        [("abs0", spec)],
        num_devices,
    )


def _run(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> tuple[list, list[str]]:
    """The compiled model's outputs and warnings, after checking that ``sharding.check`` finds no error."""
    errors = [d for d in sharding.check(model) if d.severity == "error"]
    assert not errors, errors  # check accepts the spec, so compile must run it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outputs = onnx2jax.compile(model)(**inputs)
    unsharded = onnx2jax.translate(model)(**inputs)
    for got, plain in zip(outputs, unsharded):
        np.testing.assert_allclose(np.asarray(got), np.asarray(plain), rtol=1e-6, atol=1e-6)
    return list(outputs), [str(w.message) for w in caught]


def _replicated_with_warning(warned: list[str], output: str) -> None:
    assert any(
        f"output {output!r}" in w and "do not divide it evenly" in w and w.endswith("comes back replicated")
        for w in warned
    ), warned


def test_issue40_first_two_devices_size_one_sub_axis_in_two():
    # Abs(in2: float[5]), 2 devices, spec on in2: axis 0 as (1 x 2 shards, 5 x 1 shard) on devices [0, 1]
    spec = _fused("in2", 0, [(1, 2), (5, 1)], [0, 1])
    x = np.array([-2.0, 1.5, 0.0, -0.5, 3.0], np.float32)
    (out,), warned = _run(_abs([5], spec, 2), {"in2": x})
    assert_placed(out, None, np.abs(x))
    _replicated_with_warning(warned, "out")  # Abs's output inherits in2's spec, which JAX cannot hold
    # the spec itself: device 0 holds all 5 elements, device 1 none (DESIGN, "uneven sizes")
    regions = sharding.device_regions(spec, (5,))
    assert [r.ranges for r in regions[0]] == [(((0, 5),),)] and [r.ranges for r in regions[1]] == [((),)]


def test_issue40_second_groups_on_an_output_axis_of_three():
    # Abs(in2: float[3, 1, 3]), 8 devices, spec on the output: axis 2 as (1 x 4, 3 x 1) over four groups
    groups = ((-1, (4, 3)), (-2, (2, 5)), (-3, (1, 7)), (-4, (6, 0)))
    spec = _fused("out", 2, [(1, 4), (3, 1)], [-1, -2, -3, -4], groups)
    x = np.arange(-4, 5, dtype=np.float32).reshape(3, 1, 3)
    (out,), warned = _run(_abs([3, 1, 3], spec, 8), {"in2": x})
    assert_placed(out, None, np.abs(x))
    _replicated_with_warning(warned, "out")


def test_issue40_third_expanded_operand_of_add():
    # Sub(in2[1], in3[1]) -> Expand(to [2]) -> Add(w7[2]); the Add's first input fused as (1 x 4, 2 x 1)
    groups = ((-1, (0, 4)), (-2, (1, 5)), (-3, (2, 6)), (-4, (3, 7)))
    spec = _fused("t5", -1, [(1, 4), (2, 1)], [-1, -2, -3, -4], groups)
    w7 = np.array([1.5, -2.5], np.float32)
    model = _model(
        [
            oh.make_node("Sub", ["in2", "in3"], ["t4"], name="sub0"),
            oh.make_node("Expand", ["t4", "c5"], ["t5"], name="expand1"),
            oh.make_node("Add", ["t5", "w7"], ["out"], name="add2"),
        ],
        [oh.make_tensor_value_info("in2", FLOAT, [1]), oh.make_tensor_value_info("in3", FLOAT, [1])],
        [oh.make_tensor_value_info("out", FLOAT, [2])],
        [onh.from_array(np.array([2], np.int64), "c5"), onh.from_array(w7, "w7")],
        [("add2", spec)],
        8,
    )
    a, b = np.array([3.0], np.float32), np.array([1.25], np.float32)
    (out,), warned = _run(model, {"in2": a, "in3": b})
    assert_placed(out, None, np.broadcast_to(a - b, (2,)) + w7)
    _replicated_with_warning(warned, "out")  # the Add's output inherits the fused spec


@pytest.mark.parametrize(
    "parts, devices, held",
    [
        ([(3, 2), (2, 1)], [3, 6], False),  # 6 as 3 x 2 shards: blocks [0, 4), [4, 6); a plain split is [0, 3), [3, 6)
        ([(4, 2), (2, 1)], [3, 6], True),  # 8 as 4 x 2 shards: [0, 4), [4, 8), exactly a plain split: held as it
        ([(1, 1), (6, 2)], [3, 6], True),  # a size-1 sub-axis first changes nothing: [0, 3), [3, 6)
        ([(2, 2), (6, 2)], [5, 1, 4, 0], True),  # both cut, the first into single rows: 4 blocks of 3, in order
        ([(2, 2), (1, 2)], [5, 1, 4, 0], False),  # the 1 cut 2 ways: two devices hold nothing
    ],
    ids=["uneven-sub-axis", "even-sub-axis", "size-1-first", "two-cut-sub-axes", "size-1-cut"],
)
def test_output_fused_in_contiguous_blocks_is_a_plain_split(parts, devices, held):
    size = parts[0][0] * parts[1][0]
    spec = _fused("out", 1, parts, devices)
    x = np.random.default_rng(0).standard_normal((4, size)).astype(np.float32)
    (out,), warned = _run(_abs([4, size], spec, 8), {"in2": x})
    if held:
        assert_placed(out, spec, np.abs(x))
        assert not warned, warned
    else:
        # axis 1's mesh axes move to axis 0 (4 rows divide by 2 and by 4), in the spec's device order
        assert_placed(out, ShardingSpec.split("out", {0: len(devices)}, devices), np.abs(x))
        assert any("'out'" in w and "split on axis 0 instead" in w for w in warned), warned
