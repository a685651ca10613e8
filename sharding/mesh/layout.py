"""ONNX sharding specs -> one jax Mesh and a PartitionSpec per spec.

One SPMD program needs one device order for all of its shardings. A spec's
*layout* says which devices hold each shard; a ``NamedSharding(mesh, P(...))``
says the same thing through mesh axes. This module finds a mesh on which every
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
import itertools
import math
from typing import Sequence

import numpy as np

from sharding.spec import ShardingSpec


class MeshMappingError(ValueError):
    """A spec cannot be expressed as a NamedSharding on the mesh; says which and why."""


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
    count = math.prod(n for _, n in grid)
    shard_devices = tuple(frozenset(spec.devices_of_shard(k)) for k in range(count))
    fused = tuple(
        (axis, tuple(expanded[first_sub_dim[axis] : first_sub_dim[axis] + len(sd.parts)]))
        for axis, sd in sorted(by_axis.items())
        if len(sd.parts) > 1
    )
    return Layout(grid=tuple(grid), shard_devices=shard_devices, rank=len(expanded), fused=fused)


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
    result = []
    for index in itertools.product(*[range(n) for n in grid_sizes]):
        coords: list[object] = [slice(None)] * len(plan.axis_sizes)
        for g, i in enumerate(index):
            axes = assignment.get(g, ())
            sizes = [plan.axis_sizes[a] for a in axes]
            digits = np.unravel_index(i, sizes) if sizes else ()
            for a, d in zip(axes, digits):
                coords[a] = int(d)
        block = array[tuple(coords)]
        result.append(frozenset(int(d) for d in np.ravel(block)))  # free axes: replicas
    return result


def _assignments(sizes: Sequence[int], axis_sizes: Sequence[int]):
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
    sizes = [n for _, n in layout.grid]
    for assignment in _assignments(sizes, plan.axis_sizes):
        got = _devices_for(plan, assignment, sizes)
        ok = all(
            (want == have) if exact else want <= have for want, have in zip(layout.shard_devices, got)
        )
        if ok:
            entries: list[tuple[str, ...] | None] = [None] * layout.rank
            for g, (dim, _) in enumerate(layout.grid):
                axes = tuple(plan.axis_names[a] for a in assignment[g])
                if axes:
                    entries[dim] = axes
            return tuple(entries)
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


def _candidate_orders(layouts: Sequence[Layout], num_devices: int) -> list[tuple[int, ...]]:
    """Device orders worth trying: the identity, then orders read off each spec.

    A spec on every device gives its shard-major and replica-major orders; a
    spec on some devices gives its shard-major order followed by the devices
    it leaves out (which then hold replicas).
    """
    everyone = list(range(num_devices))
    orders = [tuple(everyone)]
    for layout in layouts:
        groups = [sorted(s) for s in layout.shard_devices]
        shard_major = [d for g in groups for d in g]
        sizes = {len(g) for g in groups}
        replica_major = [g[r] for r in range(len(groups[0])) for g in groups] if len(sizes) == 1 else shard_major
        for order in (shard_major, replica_major):
            if len(set(order)) != len(order):
                continue
            order = tuple(order + [d for d in everyone if d not in order])
            if order not in orders:
                orders.append(order)
    return orders


def _merge_axes(plan: MeshPlan, pspecs: list[PSpec]) -> tuple[MeshPlan, list[PSpec]]:
    """Merges neighbouring mesh axes that every PartitionSpec uses together, in order."""
    names = list(plan.axis_names)
    sizes = list(plan.axis_sizes)
    changed = True
    while changed and len(names) > 1:
        changed = False
        for i in range(len(names) - 1):
            a, b = names[i], names[i + 1]
            if all(_together(p, a, b) for p in pspecs):
                merged = f"{a}+{b}"
                pspecs = [_rename(p, a, b, merged) for p in pspecs]
                names[i : i + 2] = [merged]
                sizes[i : i + 2] = [sizes[i] * sizes[i + 1]]
                changed = True
                break
    # Give the surviving axes short names again: d0, d1, ...
    final = tuple(f"d{i}" for i in range(len(names)))
    rename = dict(zip(names, final))
    pspecs = [tuple(None if e is None else tuple(rename[a] for a in e) for e in p) for p in pspecs]
    return MeshPlan(final, tuple(sizes), plan.device_order), pspecs


def _together(pspec: PSpec, a: str, b: str) -> bool:
    for entry in pspec:
        if entry is None:
            continue
        if a in entry or b in entry:
            if a not in entry or b not in entry or entry.index(b) != entry.index(a) + 1:
                return False
    return True


def _rename(pspec: PSpec, a: str, b: str, merged: str) -> PSpec:
    out = []
    for entry in pspec:
        if entry is not None and a in entry:
            i = entry.index(a)
            entry = (*entry[:i], merged, *entry[i + 2 :])
        out.append(entry)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class MeshMapping:
    """The result of mapping a configuration's specs onto one mesh.

    Attributes:
      plan: the mesh (names, sizes, device order).
      pspecs: per spec key, the PartitionSpec entries (over expanded dims).
      partial: per spec key that uses only some devices, the devices that hold
        replicas although the spec does not name them.
    """

    plan: MeshPlan
    pspecs: dict[object, PSpec]
    partial: dict[object, frozenset[int]]


def map_specs(
    layouts: dict[object, Layout], num_devices: int, plan: MeshPlan | None = None
) -> MeshMapping:
    """Finds one mesh on which every layout is a NamedSharding.

    Args:
      layouts: the specs to express, by any key the caller uses to name them
        (the key appears in error messages).
      num_devices: the configuration's device count.
      plan: a fixed mesh (a user's mesh); when None one is searched for.

    Raises:
      MeshMappingError: naming every spec that cannot be expressed, and why.
    """
    everyone = frozenset(range(num_devices))
    if plan is not None:
        candidates = [plan]
    else:
        factors = prime_factors(num_devices) or [1]
        factor_orders = sorted(set(itertools.permutations(factors)))
        candidates = [
            MeshPlan(tuple(f"d{i}" for i in range(len(fs))), fs, order)
            for order in _candidate_orders(list(layouts.values()), num_devices)
            for fs in factor_orders
        ]
    best: tuple[MeshPlan, dict, list] | None = None
    for candidate in candidates:
        pspecs, failed = {}, []
        for key, layout in layouts.items():
            found = find_pspec(layout, candidate, exact=layout.devices == everyone)
            if found is None:
                failed.append(key)
            else:
                pspecs[key] = found
        if not failed:
            best = (candidate, pspecs, [])
            break
        if best is None or len(failed) < len(best[2]):
            best = (candidate, pspecs, failed)
    assert best is not None
    chosen, pspecs, failed = best
    if failed and plan is None:
        # The orders read off the specs were not enough: search them all.
        chosen, pspecs = _complete_search(layouts, num_devices)
        failed = []
    if failed:
        raise MeshMappingError(_explain_failures(failed, layouts, chosen))
    keys = list(pspecs)
    if plan is None:
        chosen, merged = _merge_axes(chosen, [pspecs[k] for k in keys])
        pspecs = dict(zip(keys, merged))
    # On a NamedSharding every mesh device holds some shard, so the devices a
    # partial spec leaves out hold replicas.
    partial = {key: everyone - layouts[key].devices for key in keys if layouts[key].devices != everyone}
    return MeshMapping(chosen, pspecs, partial)


def _complete_search(layouts: dict[object, Layout], num_devices: int) -> tuple[MeshPlan, dict[object, PSpec]]:
    """The plan and PartitionSpecs of :func:`sharding.mesh.search.search`.

    Raises:
      MeshMappingError: no mesh exists; names the specs no mesh expresses
        alone, or those that conflict with the specs before them.
    """
    from sharding.mesh import search as mesh_search  # it builds on this module's Layout and assignments

    keys = list(layouts)
    found = mesh_search.search([layouts[k] for k in keys], num_devices)
    if found is None:
        raise MeshMappingError(_explain_impossible(layouts, num_devices))
    axis_sizes, order, per_layout = found
    plan = MeshPlan(tuple(f"d{i}" for i in range(len(axis_sizes))), axis_sizes, order)
    pspecs = {}
    for key, assignment in zip(keys, per_layout):
        layout = layouts[key]
        entries: list[tuple[str, ...] | None] = [None] * layout.rank
        for g, (dim, _) in enumerate(layout.grid):
            if assignment.get(g):
                entries[dim] = tuple(plan.axis_names[a] for a in assignment[g])
        pspecs[key] = tuple(entries)
    return plan, pspecs


def _explain_impossible(layouts: dict[object, Layout], num_devices: int) -> str:
    """Which specs no mesh expresses: alone, or together with the specs accepted before them."""
    from sharding.mesh import search as mesh_search

    alone = [k for k, layout in layouts.items() if mesh_search.search([layout], num_devices) is None]
    accepted: list = []
    conflicts: list = []
    for key, layout in layouts.items():
        if key in alone:
            continue
        if mesh_search.search([layouts[k] for k in accepted] + [layout], num_devices) is None:
            conflicts.append(key)
        else:
            accepted.append(key)
    lines = [f"  {k}: {_describe(layouts[k])} (no mesh expresses it, whatever the other specs)" for k in alone]
    lines += [f"  {k}: {_describe(layouts[k])}" for k in conflicts]
    tried = mesh_search.search_size(list(layouts.values()), num_devices)
    return (
        f"{len(alone) + len(conflicts)} sharding spec(s) cannot be expressed as a NamedSharding on "
        "any mesh that also fits the other specs:\n"
        + "\n".join(lines)
        + f"\nTried: the device orders read off the specs, then {tried}; the specs listed are those "
        "that no order fits together with the specs before them (in graph order). "
        "A NamedSharding places shard i of a split axis on a block of the mesh's device array; "
        "reorder the devices of these specs, or run them in another configuration."
    )


def _describe(layout: Layout) -> str:
    grid = " x ".join(str(n) for _, n in layout.grid) or "no split"
    shards = ", ".join("{" + ",".join(map(str, sorted(s))) + "}" for s in layout.shard_devices[:8])
    return f"shard grid {grid}, shard devices {shards}"


def _explain_failures(failed: list, layouts: dict, plan: MeshPlan) -> str:
    """Names the specs a given mesh cannot express."""
    lines = [f"  {key}: {_describe(layouts[key])}" for key in failed]
    return (
        f"{len(failed)} sharding spec(s) cannot be expressed as a NamedSharding on the given mesh "
        f"(axes {dict(zip(plan.axis_names, plan.axis_sizes))}, devices {plan.device_array().tolist()}):\n"
        + "\n".join(lines)
        + "\nTried: every assignment of the mesh's axes to each spec's shard-grid axes. "
        "A NamedSharding places shard i of a split axis on a block of the mesh's device array; "
        "these device assignments are not such blocks. Reorder the devices of these specs, "
        "pass devices= to place the configuration's devices differently on the mesh, or let "
        "compile build the mesh (mesh=None)."
    )
