"""A spec's layout on the devices, and a mesh plan's: what :mod:`sharding.mesh.mapping` matches.

The mapping (ONNX sharding specs -> one jax Mesh and a PartitionSpec per spec) is in
:mod:`sharding.mesh.mapping`, the complete search in :mod:`sharding.mesh.search`; how they work:

One SPMD program needs one device order for all of its shardings. A spec's
*layout* says which devices hold each shard; a ``NamedSharding(mesh, P(...))``
says the same thing through mesh axes. :func:`~sharding.mesh.mapping.map_specs` finds a mesh on which every
spec of a configuration is a NamedSharding, or says which spec cannot be
expressed and why.

How the search works. The mesh is first built with one axis per prime factor
of the device count (8 devices -> axes of sizes 2, 2, 2), over a candidate
device order taken from the specs themselves. On that mesh a PartitionSpec
may give a tensor axis any ordered tuple of mesh axes, so every spec that is
expressible on a coarser mesh with the same device order is expressible here
too. For each spec we search the assignment of mesh axes to its shard-grid
axes (a small backtracking search: the assigned axes' sizes must multiply to
the shard count), and check the device sets it implies against the spec's.
When none of the orders read off the specs fits them all, the complete
search of :mod:`sharding.mesh.search` decides: it finds a device order
whenever one exists, and otherwise the error names the specs that conflict
and says what was tried. Finally, mesh axes that every PartitionSpec uses
together, adjacent and in order, are merged back (a Megatron plan on 8
devices ends as one axis of 8).

Worked example (proposal 0007's broadcast): 4 devices, mesh axes a0, a1 of
size 2 over devices [[0, 1], [2, 3]]. Output [M, N] split 2x2 on devices
[0, 1, 2, 3] is P(a0, a1): shard [i, j] lives on devices[i, j] = 2i + j.
Input1 [M, 1], axis 0 in 2 shards on groups {0, 1}, {2, 3}, is P(a0, None):
shard i lives on devices[i, :], replicated over a1.

Fused axes (several simple_shardings on one axis) are expanded into their
sub-axes first: a [H, 2F] weight whose axis 1 is [{2, 1 shard}, {F, 2 shards}]
has the layout of a [H, 2, F] tensor split 2 ways on its last axis.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Sequence

import numpy as np

from sharding.spec import ShardingSpec


class MeshMappingError(ValueError):
    """A spec cannot be expressed as a NamedSharding on the mesh; says which and why.

    On a mesh the user gave, the message is short: how many specs fail, the
    first, and a mesh that works (when one exists); the attributes hold the rest.

    Attributes:
      failures: (spec key, its layout in words) for every spec that failed on
        the given mesh; empty when the message names them all.
      working: a mesh (:class:`MeshPlan`) on which every spec is a
        NamedSharding, found when the given mesh failed; None if none exists
        or the mesh was searched for.
    """

    def __init__(self, message: str, *, failures: Sequence[tuple[object, str]] = (),
                 working: "MeshPlan | None" = None):
        super().__init__(message)
        self.failures = tuple(failures)
        self.working = working


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a spec puts each shard, independent of any mesh.

    Attributes:
      fused: for each fused tensor axis, its sub-axis sizes (axis -> sizes).
      grid: one entry per shard-grid axis, in the spec's (row-major) order:
        (expanded tensor dim, number of shards).
      shard_devices: for each shard (row-major over ``grid``), its device set.
      rank: the rank of the (expanded) tensor.
    """

    grid: tuple[tuple[int, int], ...]
    shard_devices: tuple[frozenset[int], ...]
    rank: int
    fused: tuple[tuple[int, tuple[int, ...]], ...] = ()

    @property
    def devices(self) -> frozenset[int]:
        return frozenset().union(*self.shard_devices)

    def expand(self, shape: Sequence[int]) -> tuple[int, ...]:
        """``shape`` with each fused axis replaced by its sub-axes."""
        return expand_shape(shape, self.fused)


def expand_shape(shape: Sequence[int], fused: tuple[tuple[int, tuple[int, ...]], ...]) -> tuple[int, ...]:
    """``shape`` with each fused axis replaced by its sub-axis sizes."""
    sizes = dict(fused)
    out: list[int] = []
    for axis, size in enumerate(shape):
        out.extend(sizes.get(axis, (size,)))
    return tuple(out)


def layout_of(spec: ShardingSpec, shape: Sequence[int]) -> Layout:
    """The layout of ``spec`` on a tensor of ``shape``.

    A fused axis's sub-axis sizes come from its ``dim_value`` fields (or are
    derived from the axis size when one is left out); the other axes' sizes
    do not matter (symbolic dims may be given as 0).
    """
    rank = len(shape)
    expanded: list[int] = []
    first_sub_dim: dict[int, int] = {}
    by_axis = {sd.axis % rank if rank else sd.axis: sd for sd in spec.sharded_dims}
    for axis, size in enumerate(shape):
        first_sub_dim[axis] = len(expanded)
        sd = by_axis.get(axis)
        if sd is not None and len(sd.parts) > 1:
            expanded.extend(sd.part_sizes(size))
        else:
            expanded.append(size)
    grid = []
    for sd in spec.sharded_dims:
        axis = sd.axis % rank if rank else sd.axis
        for offset, part in enumerate(sd.parts):
            grid.append((first_sub_dim[axis] + offset, part.num_shards))
    shard_devices = _shard_devices(spec.devices, spec.groups, math.prod(n for _, n in grid))
    fused = tuple(
        (axis, tuple(expanded[first_sub_dim[axis] : first_sub_dim[axis] + len(sd.parts)]))
        for axis, sd in sorted(by_axis.items())
        if len(sd.parts) > 1
    )
    return Layout(grid=tuple(grid), shard_devices=shard_devices, rank=len(expanded), fused=fused)


@functools.lru_cache(maxsize=4096)
def _shard_devices(devices: tuple[int, ...], groups: tuple, count: int) -> tuple[frozenset[int], ...]:
    """Each shard's device set, from a spec's device entries and groups (one per distinct spec geometry: a
    model's thousands of specs share a few, and each call's layouts recompute them)."""
    members = dict(groups)
    return tuple(frozenset((devices[k],) if devices[k] >= 0 else members[devices[k]]) for k in range(count))


@dataclasses.dataclass(frozen=True)
class MeshPlan:
    """A mesh as names, sizes and a device order, before any jax device is involved.

    ``device_order[i]`` is the configuration device at flat (row-major)
    position i of the mesh's device array.
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    device_order: tuple[int, ...]

    def device_array(self) -> np.ndarray:
        return np.asarray(self.device_order, dtype=np.int64).reshape(self.axis_sizes)


PSpec = tuple  # one entry per (expanded) tensor dim: None or a tuple of mesh axis names


def _devices_for(plan: MeshPlan, assignment: dict[int, tuple[int, ...]], grid_sizes: Sequence[int]) -> list[frozenset[int]]:
    """Device set of every shard when grid axis g is mapped to mesh axes ``assignment[g]``."""
    array = plan.device_array()
    # Move each grid axis's mesh axes to the front, in grid order, the free (replica) axes last: shard k of
    # the row-major grid is then row k of the reshaped array.
    used = [a for g in range(len(grid_sizes)) for a in assignment.get(g, ())]
    free = [a for a in range(array.ndim) if a not in used]
    rows = array.transpose(used + free).reshape(math.prod(grid_sizes), -1)
    return [frozenset(row.tolist()) for row in rows]


def assignments(sizes: Sequence[int], axis_sizes: Sequence[int]):
    """Every way to give grid axis g an ordered tuple of distinct mesh axes multiplying to sizes[g]."""

    def ordered_subsets(available: tuple[int, ...], target: int):
        if target == 1:
            yield ()
            return
        for a in available:
            if target % axis_sizes[a] == 0:
                rest = tuple(x for x in available if x != a)
                for tail in ordered_subsets(rest, target // axis_sizes[a]):
                    yield (a, *tail)

    def walk(g: int, available: tuple[int, ...]):
        if g == len(sizes):
            yield {}
            return
        for chosen in ordered_subsets(available, sizes[g]):
            rest = tuple(a for a in available if a not in chosen)
            for tail in walk(g + 1, rest):
                yield {g: chosen, **tail}

    yield from walk(0, tuple(range(len(axis_sizes))))


def find_pspec(layout: Layout, plan: MeshPlan, *, exact: bool) -> PSpec | None:
    """The PartitionSpec entries expressing ``layout`` on ``plan``, or None.

    Args:
      exact: the spec's device sets must equal the mesh's. When False (a spec
        that uses only some of the mesh's devices), each spec device set must
        be contained in the mesh's: the other devices hold replicas.
    """
    assignment = _assignment(tuple(n for _, n in layout.grid), layout.shard_devices, plan, exact)
    if assignment is None:
        return None
    entries: list[tuple[str, ...] | None] = [None] * layout.rank
    for (dim, _), axes in zip(layout.grid, assignment):
        if axes:
            entries[dim] = tuple(plan.axis_names[a] for a in axes)
    return tuple(entries)


@functools.lru_cache(maxsize=4096)
def _assignment(
    sizes: tuple[int, ...], shard_devices: tuple[frozenset[int], ...], plan: MeshPlan, exact: bool
) -> tuple[tuple[int, ...], ...] | None:
    """The first assignment of mesh axes to the grid axes that puts each shard on its devices, or None.

    It depends on the grid and the device sets only, not on the tensor: the many specs of a model that
    share a layout (every column-split activation, say) are searched once per mesh, and again at no cost
    when a call's shapes map the specs anew.
    """
    for assignment in assignments(sizes, plan.axis_sizes):
        got = _devices_for(plan, assignment, sizes)
        if all((want == have) if exact else want <= have for want, have in zip(shard_devices, got)):
            return tuple(assignment[g] for g in range(len(sizes)))
    return None


def prime_factors(n: int) -> list[int]:
    """The prime factors of ``n``, ascending (``[]`` for 1): the axis sizes of the finest mesh."""
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


def describe(layout: Layout) -> str:
    """A layout in words for error messages: its shard grid and the devices of its first shards."""
    grid = " x ".join(str(n) for _, n in layout.grid) or "no split"
    shards = ", ".join("{" + ",".join(map(str, sorted(s))) + "}" for s in layout.shard_devices[:8])
    return f"shard grid {grid}, shard devices {shards}"
