"""nanotron's split configs: the fused-axis equivalent, unequal chunks, permutation."""

import numpy as np
import pytest

from sharding import (
    ChunkedSplit,
    Region,
    ShardedDim,
    ShardingSpec,
    SimpleShardedDim,
    SplitConfig,
    contiguous_permutation,
    merge,
    spec_from_split_config,
    split,
)


def test_nanotron_doc_example_local_global_slices():
    # nanotron's docs: chunks (100, 100) over 2 ranks.
    regions = ChunkedSplit(SplitConfig(0, (100, 100)), (200,), (0, 1)).regions()
    assert regions[0].local_global_pairs() == (
        ((slice(0, 50),), (slice(0, 50),)),
        ((slice(50, 100),), (slice(100, 150),)),
    )
    assert regions[1].local_global_pairs() == (
        ((slice(0, 50),), (slice(50, 100),)),
        ((slice(50, 100),), (slice(150, 200),)),
    )


def test_equal_chunks_are_a_fused_axis():
    spec = spec_from_split_config(SplitConfig(1, (4, 4)), (3, 8), [5, 7], "gate_up")
    assert spec == ShardingSpec(
        "gate_up",
        (ShardedDim(1, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(2, dim_value=4))),),
        (5, 7),
    )
    w = np.arange(24).reshape(3, 8)
    expected = {5: w[:, [0, 1, 4, 5]], 7: w[:, [2, 3, 6, 7]]}
    chunked = ChunkedSplit(SplitConfig(1, (4, 4)), (3, 8), (5, 7))
    for shards in (split(w, spec), chunked.split(w)):
        assert sorted(shards) == [5, 7]
        for device, local in expected.items():
            np.testing.assert_array_equal(shards[device], local)


def test_no_chunks_is_a_plain_split():
    spec = spec_from_split_config(SplitConfig(0), (6, 2), [0, 1, 2], "W")
    assert spec == ShardingSpec.split("W", {0: 3}, [0, 1, 2])
    one_chunk = spec_from_split_config(SplitConfig(-2, (6,)), (6, 2), [0, 1, 2], "W")
    assert one_chunk == ShardingSpec.split("W", {-2: 3}, [0, 1, 2])


def test_unequal_chunks_have_no_onnx_spec():
    with pytest.raises(
        ValueError, match=r"contiguous_chunks \(64, 16, 16\) are unequal.*contiguous_permutation"
    ):
        spec_from_split_config(SplitConfig(0, (64, 16, 16)), (96, 8), [0, 1], "qkv")


def test_unequal_chunks_split_and_merge():
    # GQA's fused q/k/v: q 64 rows, k 16, v 16, over 2 ranks.
    qkv = ChunkedSplit(SplitConfig(0, (64, 16, 16)), (96, 2), (3, 1))
    assert qkv.regions() == {
        3: Region(0, (((0, 32), (64, 72), (80, 88)), ((0, 2),))),
        1: Region(1, (((32, 64), (72, 80), (88, 96)), ((0, 2),))),
    }
    w = np.arange(192).reshape(96, 2)
    shards = qkv.split(w)
    rows0 = list(range(0, 32)) + list(range(64, 72)) + list(range(80, 88))
    rows1 = list(range(32, 64)) + list(range(72, 80)) + list(range(88, 96))
    np.testing.assert_array_equal(shards[3], w[rows0])
    np.testing.assert_array_equal(shards[1], w[rows1])
    np.testing.assert_array_equal(qkv.merge(shards), w)


def test_contiguous_permutation_makes_a_plain_split_equivalent():
    config = SplitConfig(0, (64, 16, 16))
    perm = contiguous_permutation(config, (96, 2), 2)
    expected = (
        list(range(0, 32))
        + list(range(64, 72))
        + list(range(80, 88))
        + list(range(32, 64))
        + list(range(72, 80))
        + list(range(88, 96))
    )
    assert perm.tolist() == expected
    w = np.arange(192).reshape(96, 2)
    plain = split(np.take(w, perm, axis=0), ShardingSpec.split("qkv", {0: 2}, [3, 1]))
    chunked = ChunkedSplit(config, (96, 2), (3, 1)).split(w)
    for device in (3, 1):
        np.testing.assert_array_equal(plain[device], chunked[device])
    np.testing.assert_array_equal(
        merge(plain, ShardingSpec.split("qkv", {0: 2}, [3, 1]), (96, 2))[np.argsort(perm)], w
    )


@pytest.mark.parametrize(
    "build, match",
    [
        (
            lambda: ChunkedSplit(SplitConfig(0, (4, 3)), (7,), (0, 1)),
            r"chunks \[3\] of \(4, 3\) do not divide into 2 shards",
        ),
        (
            lambda: ChunkedSplit(SplitConfig(0, (4, 4)), (6,), (0, 1)),
            r"sum to 8, but axis 0 has size 6",
        ),
        (lambda: ChunkedSplit(SplitConfig(2), (6,), (0, 1)), "split_dim 2 is out of range"),
        (lambda: ChunkedSplit(SplitConfig(0), (6,), (0, 0)), "devices must be distinct"),
        (lambda: SplitConfig(0, (4, 0)), "positive ints"),
        (
            lambda: ChunkedSplit(SplitConfig(0), (6,), (0, 1)).split(np.zeros(4)),
            r"shape \(4,\), expected \(6,\)",
        ),
    ],
)
def test_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()
