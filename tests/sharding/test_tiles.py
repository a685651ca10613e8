"""Shard geometry on the worked examples of proposals 0006 and 0007, contents written by hand."""

import numpy as np
import pytest

from sharding import (
    Region,
    ShardedDim,
    ShardingSpec,
    SimpleShardedDim,
    device_regions,
    merge,
    parse_spec,
    split,
    tile_assignment,
)

X = np.array([[1, 2], [3, 4]])


def assert_shards(actual, expected):
    assert sorted(actual) == sorted(expected)
    for device, local in expected.items():
        np.testing.assert_array_equal(actual[device], np.array(local), err_msg=f"device {device}")
        assert actual[device].shape == np.array(local).shape, f"device {device}"


# Proposal 0006 on [[1, 2], [3, 4]]; the mixed example with its typo corrected.
PROPOSAL_0006 = {
    "axis 0 on [0,1]": ("0:2 @ [0,1]", {0: [[1, 2]], 1: [[3, 4]]}),
    "axis 1 on [0,1]": ("1:2 @ [0,1]", {0: [[1], [3]], 1: [[2], [4]]}),
    "2x2 on [0,1,2,3]": ("0:2,1:2 @ [0,1,2,3]", {0: [[1]], 1: [[2]], 2: [[3]], 3: [[4]]}),
    "replicated on {0,1}": ("replicated @ [{0,1}]", {0: [[1, 2], [3, 4]], 1: [[1, 2], [3, 4]]}),
    "mixed: axis 0 on {0,1},{2,3}": (
        "0:2 @ [{0,1},{2,3}]",
        {0: [[1, 2]], 1: [[1, 2]], 2: [[3, 4]], 3: [[3, 4]]},
    ),
}


@pytest.mark.parametrize("text, expected", PROPOSAL_0006.values(), ids=PROPOSAL_0006.keys())
def test_proposal_0006_examples(text, expected):
    spec = parse_spec(text, "X")
    shards = split(X, spec)
    assert_shards(shards, expected)
    np.testing.assert_array_equal(merge(shards, spec, X.shape), X)


def test_proposal_0006_mixed_example_as_written_in_the_proto():
    spec = ShardingSpec(
        "X", (ShardedDim(0, (SimpleShardedDim(2),)),), (-1, -2), {-1: (0, 1), -2: (2, 3)}
    )
    assert_shards(split(X, spec), {0: [[1, 2]], 1: [[1, 2]], 2: [[3, 4]], 3: [[3, 4]]})


def test_proposal_0007_broadcast_inputs_meet_on_the_output_devices():
    m, n = 4, 6
    input1 = np.arange(m).reshape(m, 1)
    input2 = 10 * np.arange(n).reshape(1, n)
    spec1 = parse_spec("0:2 @ [{0,1},{2,3}]", "Input1")
    spec2 = parse_spec("1:2 @ [{0,2},{1,3}]", "Input2")
    output = parse_spec("0:2,1:2 @ [0,1,2,3]", "Output")

    assert_shards(
        split(input1, spec1), {0: [[0], [1]], 1: [[0], [1]], 2: [[2], [3]], 3: [[2], [3]]}
    )
    assert_shards(
        split(input2, spec2),
        {0: [[0, 10, 20]], 2: [[0, 10, 20]], 1: [[30, 40, 50]], 3: [[30, 40, 50]]},
    )
    # Each device computes its output block from the input blocks it holds.
    held1, held2 = split(input1, spec1), split(input2, spec2)
    local = {d: held1[d] + held2[d] for d in range(4)}
    assert_shards(local, split(input1 + input2, output))
    assert_shards(
        local,
        {
            0: [[0, 10, 20], [1, 11, 21]],
            1: [[30, 40, 50], [31, 41, 51]],
            2: [[2, 12, 22], [3, 13, 23]],
            3: [[32, 42, 52], [33, 43, 53]],
        },
    )


def test_device_regions_of_the_mixed_example():
    regions = device_regions(parse_spec("0:2 @ [{0,1},{2,3}]"), (2, 2))
    top = Region(0, (((0, 1),), ((0, 2),)))
    bottom = Region(1, (((1, 2),), ((0, 2),)))
    assert regions == {0: [top], 1: [top], 2: [bottom], 3: [bottom]}


def test_uneven_sizes_follow_the_gspmd_rule():
    # 5 rows in 4 shards: blocks of ceil(5/4) = 2, so 2, 2, 1 and an empty fourth.
    x = np.arange(5)
    spec = parse_spec("0:4 @ [0,1,2,3]")
    assert_shards(split(x, spec), {0: [0, 1], 1: [2, 3], 2: [4], 3: np.zeros(0, int)})
    assert device_regions(spec, (5,))[3] == [Region(3, ((),))]
    np.testing.assert_array_equal(merge(split(x, spec), spec, (5,)), x)


def test_fused_axis_gives_each_device_several_ranges():
    # DESIGN point 1: width 2F = 8 as [{2, 1 shard}, {F, 2 shards}];
    # device 0 holds columns [0, F/2) + [F, 3F/2).
    x = np.arange(16).reshape(2, 8)
    spec = parse_spec("1:(2x1,4x2) @ [0,1]")
    assert_shards(
        split(x, spec), {0: [[0, 1, 4, 5], [8, 9, 12, 13]], 1: [[2, 3, 6, 7], [10, 11, 14, 15]]}
    )
    (region,) = device_regions(spec, (2, 8))[0]
    assert region.ranges == (((0, 2),), ((0, 2), (4, 6)))
    assert region.shape == (2, 4)
    assert region.local_global_pairs() == (
        ((slice(0, 2), slice(0, 2)), (slice(0, 2), slice(0, 2))),
        ((slice(0, 2), slice(2, 4)), (slice(0, 2), slice(4, 6))),
    )


def test_fused_axis_with_inner_split_and_second_axis():
    # Worked example of sharding/_geometry.py: shard 1 holds rows [2, 4), columns [0, 2) + [4, 6).
    x = np.arange(32).reshape(4, 8)
    spec = parse_spec("1:(2x1,4x2),0:2 @ [0,1,2,3]")
    assert_shards(
        split(x, spec),
        {
            0: [[0, 1, 4, 5], [8, 9, 12, 13]],
            1: [[16, 17, 20, 21], [24, 25, 28, 29]],
            2: [[2, 3, 6, 7], [10, 11, 14, 15]],
            3: [[18, 19, 22, 23], [26, 27, 30, 31]],
        },
    )


def test_tile_assignment():
    grid = tile_assignment(parse_spec("1:2,0:2 @ [{0,1},2,3,{5,4}]"), (4, 4))
    assert grid.shape == (2, 2)
    assert grid.tolist() == [[(0, 1), (3,)], [(2,), (4, 5)]]
    assert tile_assignment(parse_spec("replicated @ [{1,0}]"), (3,)).tolist() == [(0, 1)]
    fused = tile_assignment(parse_spec("0:(2x2,4x2) @ [3,2,1,0]"), (8,))
    assert fused.tolist() == [(3,), (2,), (1,), (0,)]


def test_scalar_tensors():
    spec = parse_spec("replicated @ [{0,1}]")
    shards = split(np.array(7.5), spec)
    assert_shards(shards, {0: 7.5, 1: 7.5})
    assert merge(shards, spec, ()) == np.array(7.5)


def test_split_rejects_a_device_holding_two_shards():
    with pytest.raises(ValueError, match="tensor 'X': device 0 holds shards 0, 1"):
        split(X, parse_spec("0:2 @ [0,{0,1}]", "X"))
    assert [r.shard for r in device_regions(parse_spec("0:2 @ [0,{0,1}]"), (2, 2))[0]] == [0, 1]


def test_split_rejects_a_spec_that_does_not_fit():
    with pytest.raises(ValueError, match="axis 2 is out of range for rank 2"):
        split(X, parse_spec("2:2 @ [0,1]"))


def test_merge_checks_replicated_copies_agree():
    spec = parse_spec("0:2 @ [{0,1},{2,3}]")
    shards = split(np.array([[1.0, np.nan], [3.0, 4.0]]), spec)
    np.testing.assert_array_equal(merge(shards, spec, (2, 2)), [[1.0, np.nan], [3.0, 4.0]])
    shards[3] = np.array([[3.0, 5.0]])
    with pytest.raises(
        ValueError,
        match=r"device 3 \(shard 1\) disagrees with another copy at global index \(1, 1\)",
    ):
        merge(shards, spec, (2, 2))


def test_merge_needs_every_element():
    spec = parse_spec("0:2 @ [{0,1},{2,3}]")
    shards = split(X, spec)
    del shards[2]
    np.testing.assert_array_equal(merge(shards, spec, (2, 2)), X)
    del shards[3]
    with pytest.raises(
        ValueError, match=r"element \(1, 0\) is on no device given; it is held by devices \[2, 3\]"
    ):
        merge(shards, spec, (2, 2))


@pytest.mark.parametrize(
    "shards, match",
    [
        (
            {0: np.array([[1, 2]]), 1: np.array([[3, 4, 5]])},
            r"device 1 \(shard 1\): local array has shape \(1, 3\), expected \(1, 2\)",
        ),
        (
            {0: np.array([[1, 2]]), 1: np.array([[3.0, 4.0]])},
            "device 1: dtype float64, other devices have int64",
        ),
        ({0: np.array([[1, 2]]), 5: np.array([[3, 4]])}, r"devices \[5\], which hold no shard"),
        ({}, "no local arrays given"),
    ],
)
def test_merge_rejects_bad_local_arrays(shards, match):
    with pytest.raises(ValueError, match=match):
        merge(shards, parse_spec("0:2 @ [0,1]"), (2, 2))
