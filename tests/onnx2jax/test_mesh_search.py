"""The mesh search is complete: specs that are NamedShardings on some mesh always get one.

Every mapping found is checked device by device against sharding.tiles'
geometry (which block of each axis a device holds), not with sharding.mesh.layout.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharding.mesh.layout import MeshMappingError, layout_of
from sharding.mesh.mapping import map_specs
from sharding.mesh.search import search
from sharding import tiles
from sharding.spec import ShardingSpec
from sharding.text import parse_spec


def _blocks_by_spec(spec: ShardingSpec, shape) -> dict[int, tuple[int, ...]]:
    """Device -> block index per axis, from sharding.tiles (one region per device)."""
    shards = {d.axis: d.parts[0].num_shards for d in spec.sharded_dims}
    out = {}
    for device, regions in tiles.device_regions(spec, shape).items():
        (region,) = regions
        out[device] = tuple(axis[0][0] // (size // shards.get(i, 1)) for i, (axis, size) in enumerate(zip(region.ranges, shape)))
    return out


def _blocks_on_mesh(plan, pspec, rank) -> dict[int, tuple[int, ...]]:
    """Device -> block index per axis under PartitionSpec ``pspec`` on ``plan``, computed from scratch."""
    array = np.asarray(plan.device_order).reshape(plan.axis_sizes)
    sizes = dict(zip(plan.axis_names, plan.axis_sizes))
    position = {plan.axis_names[i]: i for i in range(len(plan.axis_names))}
    out = {}
    for coords in itertools.product(*[range(s) for s in plan.axis_sizes]):
        block = []
        for entry in tuple(pspec) + (None,) * (rank - len(pspec)):
            index = 0
            for name in entry or ():
                index = index * sizes[name] + coords[position[name]]
            block.append(index)
        out[int(array[coords])] = tuple(block)
    return out


def assert_expressed(specs: dict[str, ShardingSpec], shapes: dict[str, tuple], num_devices: int):
    mapping = map_specs({k: layout_of(specs[k], shapes[k]) for k in specs}, num_devices)
    assert sorted(mapping.plan.device_order) == list(range(num_devices))
    for key, spec in specs.items():
        want = _blocks_by_spec(spec, shapes[key])
        got = _blocks_on_mesh(mapping.plan, mapping.pspecs[key], len(shapes[key]))
        assert {d: got[d] for d in want} == want, (key, mapping)
    return mapping


def test_issue_example_needs_a_device_order_no_spec_lists():
    """Was "No mesh can express these specs"; order [5,1,4,0,6,3,7,2] on 2x2x2 fits both."""
    specs = {
        "a": parse_spec("0:2 @ [{6,5,1,3},{7,4,2,0}]", "a"),
        "b": parse_spec("0:2 @ [{6,7,5,4},{1,2,3,0}]", "b"),
    }
    assert_expressed(specs, {"a": (4,), "b": (4,)}, 8)


def test_two_groupings_and_a_third_axis_only_the_search_finds():
    # a: pairs on axis 0 of a 2x2x2 cube, b: pairs on axis 1, c: a 2-way split along the third axis
    # of the cube whose corner devices are scrambled: no spec lists a usable order.
    order = [3, 6, 0, 5, 7, 1, 2, 4]
    cube = np.array(order).reshape(2, 2, 2)
    group = lambda axis: [tuple(sorted(int(d) for d in np.take(cube, i, axis=axis).ravel())) for i in range(2)]  # noqa: E731
    specs = {k: ShardingSpec.split(k, {0: 2}, group(axis)) for k, axis in (("a", 0), ("b", 1), ("c", 2))}
    assert_expressed(specs, {k: (4,) for k in specs}, 8)


def test_impossible_specs_are_named_with_what_was_tried():
    specs = {
        "all": layout_of(ShardingSpec.split("a", {0: 4}, [0, 1, 2, 3]), (4,)),
        "odd": layout_of(ShardingSpec.split("b", {0: 2}, [(0, 3), (1, 2)]), (4,)),
    }
    with pytest.raises(MeshMappingError, match=r"(?s)odd: shard grid 2, shard devices \{0,3\}, \{1,2\}.*Tried: .*24 orders"):
        map_specs(specs, 4)


def test_a_device_in_two_shards_is_named_as_impossible_alone():
    specs = {"twice": layout_of(ShardingSpec.split("t", {0: 2}, [(0, 1), (1, 2)]), (4,))}
    with pytest.raises(MeshMappingError, match=r"twice: .*no mesh expresses it, whatever the other specs"):
        map_specs(specs, 4)


def test_search_agrees_with_brute_force_on_four_devices():
    """Every pair of 2-way group specs on 4 devices: the search finds a mesh iff some device order works."""
    groupings = [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    for g1, g2 in itertools.product(groupings, repeat=2):
        layouts = [layout_of(ShardingSpec.split("x", {0: 2}, g), (2,)) for g in (g1, g2)]
        brute = any(
            all(
                {frozenset(order[:2]), frozenset(order[2:])} == set(layout.shard_devices)
                or {frozenset(order[0::2]), frozenset(order[1::2])} == set(layout.shard_devices)
                for layout in layouts
            )
            for order in itertools.permutations(range(4))
        )
        assert (search(layouts, 4) is not None) == brute, (g1, g2)


MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2), (4,), (2, 2), (2, 3), (3, 2), (6,), (2, 2, 3), (12,), (3, 4)]


@st.composite
def named_shardings(draw):
    """A random mesh (axes and device permutation) and specs that are NamedShardings on it by construction."""
    shape = draw(st.sampled_from(MESHES))
    n = math.prod(shape)
    array = np.array(draw(st.permutations(range(n)))).reshape(shape)
    specs, shapes = {}, {}
    for k in range(draw(st.integers(1, 5))):
        rank = draw(st.integers(1, 3))
        free = list(draw(st.permutations(range(len(shape)))))
        entries = []
        for _ in range(rank):
            take = draw(st.integers(0, len(free)))
            entries.append(tuple(free[:take]))
            del free[:take]
        pinned = {}
        if free and draw(st.booleans()):  # a spec on some devices only
            a = free.pop()
            pinned[a] = draw(st.integers(0, shape[a] - 1))
        counts = [math.prod(shape[a] for a in e) for e in entries]
        devices = []
        for index in itertools.product(*[range(c) for c in counts]):
            coords = [slice(None)] * len(shape)
            for a, v in pinned.items():
                coords[a] = v
            for entry, i in zip(entries, index):
                if entry:
                    for a, d in zip(entry, np.unravel_index(i, [shape[a] for a in entry])):
                        coords[a] = int(d)
            block = sorted(int(d) for d in np.ravel(array[tuple(coords)]))
            devices.append(block[0] if len(block) == 1 else tuple(block))
        name = f"t{k}"
        specs[name] = ShardingSpec.split(name, {axis: c for axis, c in enumerate(counts) if c > 1}, devices)
        shapes[name] = tuple(2 * c for c in counts)
    return specs, shapes, n


@settings(max_examples=400, deadline=None)
@given(named_shardings())
def test_named_shardings_on_any_mesh_always_map(case):
    specs, shapes, n = case
    assert_expressed(specs, shapes, n)


@pytest.mark.slow
@settings(max_examples=5000, deadline=None)
@given(named_shardings())
def test_named_shardings_on_any_mesh_always_map_thousands(case):
    specs, shapes, n = case
    assert_expressed(specs, shapes, n)
