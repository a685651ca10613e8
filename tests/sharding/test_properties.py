"""Property tests on random valid specs: fused axes, groups, uneven sizes, permuted devices.

The oracle `element_shard` reads DESIGN's definition directly, element by element; it shares
no code with `sharding`.
"""

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding import (
    ShardedDim,
    ShardingSpec,
    SimpleShardedDim,
    device_regions,
    format_spec,
    merge,
    parse_spec,
    same_placement,
    split,
)

PROPERTY = settings(max_examples=100, deadline=None)


def factorisations(size):
    """Ways to write ``size`` as a product of 2 or 3 factors, in order."""
    pairs = [(a, size // a) for a in range(1, size + 1) if size % a == 0]
    triples = [
        (a, *rest)
        for a, b in pairs
        for rest in [(c, b // c) for c in range(1, b + 1) if b % c == 0]
    ]
    return pairs + triples


@st.composite
def cases(draw):
    """(spec, shape, sub-axis sizes per sharded dim) with every device holding at most one shard."""
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=rank, max_size=rank)))
    axes = draw(st.permutations(range(rank)))[: draw(st.integers(0, rank))]
    dims, sizes = [], []
    for axis in axes:
        size = shape[axis]
        sub = (
            draw(st.sampled_from(factorisations(size)))
            if size >= 2 and draw(st.booleans())
            else (size,)
        )
        shards = [draw(st.integers(1, 3)) for _ in sub]
        written = list(sub) if len(sub) > 1 or draw(st.booleans()) else [None]
        if len(sub) > 1 and draw(st.booleans()):
            written[draw(st.integers(0, len(sub) - 1))] = None  # one size left to infer
        parts = tuple(
            SimpleShardedDim(n, dim_value=v) for n, v in zip(shards, written, strict=True)
        )
        dims.append(ShardedDim(axis - rank if draw(st.booleans()) else axis, parts))
        sizes.append(sub)
    num_shards = math.prod(p.num_shards for d in dims for p in d.parts)
    copies = [draw(st.integers(1, 3)) for _ in range(num_shards)]
    devices = draw(st.permutations(range(sum(copies))))
    keys = draw(st.permutations(range(-1, -num_shards - 3, -1)))
    entries, groups, start = [], {}, 0
    for k, count in enumerate(copies):
        members = tuple(devices[start : start + count])
        start += count
        if count == 1 and draw(st.booleans()):
            entries.append(members[0])
        else:
            groups[keys[k]] = members
            entries.append(keys[k])
    if draw(st.booleans()):
        groups[keys[-1]] = (draw(st.integers(0, 50)),)  # a group no shard uses
    return ShardingSpec("T", tuple(dims), tuple(entries), groups), shape, sizes


def element_shard(spec, shape, sizes, index):
    """The shard holding element ``index``, straight from DESIGN's definition."""
    shard = 0
    for dim, sub in zip(spec.sharded_dims, sizes, strict=True):
        position = index[dim.axis % len(shape)]
        coords = []
        for size in reversed(sub):
            coords.insert(0, position % size)
            position //= size
        for coord, size, part in zip(coords, sub, dim.parts, strict=True):
            block = -(-size // part.num_shards)
            shard = shard * part.num_shards + coord // block
    return shard


def element_devices(spec, shape, sizes):
    """{element index: frozenset of devices}, element by element."""
    groups = dict(spec.groups)
    result = {}
    for index in np.ndindex(*shape):
        entry = spec.devices[element_shard(spec, shape, sizes, index)]
        result[index] = frozenset(groups[entry] if entry < 0 else (entry,))
    return result


def sample(shape):
    return np.arange(math.prod(shape), dtype=np.float64).reshape(shape) * 1.5 - 3


@PROPERTY
@given(cases())
def test_merge_of_split_is_the_identity(case):
    spec, shape, _ = case
    x = sample(shape)
    shards = split(x, spec)
    merged = merge(shards, spec, shape)
    assert merged.dtype == x.dtype
    np.testing.assert_array_equal(merged, x)


@PROPERTY
@given(cases())
def test_each_device_holds_exactly_the_elements_of_its_shard(case):
    spec, shape, sizes = case
    x = sample(shape)
    expected = element_devices(spec, shape, sizes)
    shards = split(x, spec)
    for device, local in shards.items():
        mine = [i for i, holders in expected.items() if device in holders]
        # The local array holds those elements in increasing global order along each axis.
        per_axis = [sorted({i[a] for i in mine}) for a in range(len(shape))]
        assert math.prod(len(p) for p in per_axis) == len(mine) or not mine
        if mine:
            np.testing.assert_array_equal(local, x[np.ix_(*per_axis)] if shape else x)
        else:
            assert local.size == 0
    # Every element is on at least one device.
    assert all(holders for holders in expected.values())
    covered = np.zeros(shape, dtype=int)
    for regions in device_regions(spec, shape).values():
        for region in regions:
            for _, global_slices in region.local_global_pairs():
                covered[global_slices] += 1
    assert (covered >= 1).all()


@PROPERTY
@given(cases())
def test_proto_round_trip(case):
    spec, _, _ = case
    proto = spec.to_proto()
    assert ShardingSpec.from_proto(proto) == spec
    assert (
        ShardingSpec.from_proto(proto).to_proto().SerializeToString() == proto.SerializeToString()
    )


@PROPERTY
@given(cases())
def test_text_round_trip(case):
    spec, _, _ = case
    text = format_spec(spec)
    assert parse_spec(text, "T") == spec
    assert format_spec(parse_spec(text)) == text


@PROPERTY
@given(cases(), st.data())
def test_same_placement_agrees_with_the_elements(case, data):
    spec, shape, sizes = case
    # Renumbering devices changes the placement unless it only moves devices that hold nothing.
    used = spec.all_devices()
    renumbered = dict(zip(used, data.draw(st.permutations(used)), strict=True))
    other = ShardingSpec(
        "T",
        spec.sharded_dims,
        tuple(renumbered.get(d, d) for d in spec.devices),
        {k: tuple(renumbered.get(d, d) for d in m) for k, m in spec.groups},
    )
    same = element_devices(spec, shape, sizes) == element_devices(other, shape, sizes)
    assert same_placement(spec, other, shape) == same


@PROPERTY
@given(cases(), st.data())
def test_reordering_dims_with_matching_devices_keeps_the_placement(case, data):
    spec, shape, _ = case
    dims = spec.sharded_dims
    order = data.draw(st.permutations(range(len(dims))))
    # Shard numbers are row-major over every part's blocks; move each dim's block axes together.
    counts = [p.num_shards for d in dims for p in d.parts]
    first = np.cumsum([0] + [len(d.parts) for d in dims])
    axes = [a for i in order for a in range(first[i], first[i + 1])]
    old_number = np.arange(spec.num_shards).reshape(counts).transpose(axes).ravel()
    reordered = ShardingSpec(
        "T",
        tuple(dims[i] for i in order),
        tuple(spec.devices[k] for k in old_number),
        spec.groups,
    )
    assert same_placement(spec, reordered, shape)
