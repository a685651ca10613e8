"""The complete search for a device order on which every layout is a NamedSharding.

Why it is complete. Any mesh can be refined into one axis per prime factor of
the device count without changing its device order (an axis of 4 becomes two
of 2, row-major), and a PartitionSpec on the coarse mesh names the
corresponding sub-axes on the fine one, with the same device sets. Permuting
mesh axes only renames them in PartitionSpecs. So a layout set is expressible
on some mesh exactly when it is on the prime mesh with its factors in one
fixed order and *some* device order, i.e. some bijection from devices to mesh
coordinates.

The search. Mapping a layout's shard-grid axis g (n_g shards) onto an ordered
tuple of mesh axes whose sizes multiply to n_g (an *assignment*, as in
``sharding.mesh.layout.assignments``) pins, for every device of shard k, its coordinate on
those mesh axes to the mixed-radix digits of k's grid index. An exact layout
(on every device) is then a NamedSharding exactly when the coordinates all
devices receive extend to a bijection onto the mesh coordinates: every
device lies in one shard, so the block of shard k is its device set. A
layout on some devices only needs its shards inside the blocks, which the
same pinned coordinates say. Backtracking over one assignment per distinct
layout, most constrained first, prunes as soon as two layouts pin a device's
coordinate differently or the pinned coordinates admit no bijection (a
bipartite matching of devices to coordinates). Nothing is pruned that could
still succeed, so when it finds nothing, no mesh exists.

Worked example (the issue's): 8 devices, mesh axes (2, 2, 2). ``0:2 @
[{6,5,1,3},{7,4,2,0}]`` with assignment (a0,) pins a0 = 0 on 6, 5, 1, 3 and
a0 = 1 on 7, 4, 2, 0. ``0:2 @ [{6,7,5,4},{1,2,3,0}]`` with (a1,) pins a1 = 0
on 6, 7, 5, 4 and a1 = 1 on 1, 2, 3, 0. Each (a0, a1) pair then holds two
devices, and the free a2 separates them: order [5,1,4,0,6,3,7,2] (5 at
(0,0,0)... read row-major) is one bijection.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import numpy as np

from sharding.mesh.layout import Layout, MeshMappingError, MeshPlan, PSpec, assignments, describe, prime_factors


def _pins(layout: Layout, assignment: dict[int, tuple[int, ...]], axis_sizes: Sequence[int], num_devices: int) -> np.ndarray | None:
    """The coordinates ``assignment`` pins: an array [device, mesh axis], -1 where free; None if inconsistent."""
    pins = np.full((num_devices, len(axis_sizes)), -1, dtype=np.int64)
    grid = [n for _, n in layout.grid]
    for devices, index in zip(layout.shard_devices, itertools.product(*[range(n) for n in grid])):
        row = np.full(len(axis_sizes), -1, dtype=np.int64)
        for g, i in enumerate(index):
            axes = assignment.get(g, ())
            if axes:
                for a, digit in zip(axes, np.unravel_index(i, [axis_sizes[a] for a in axes])):
                    row[a] = int(digit)
        for d in devices:
            if d >= num_devices:
                return None
            clash = (pins[d] >= 0) & (row >= 0) & (pins[d] != row)
            if clash.any():
                return None
            pins[d] = np.where(row >= 0, row, pins[d])
    return pins


def _merge(state: np.ndarray, pins: np.ndarray) -> np.ndarray | None:
    if ((state >= 0) & (pins >= 0) & (state != pins)).any():
        return None
    return np.where(state >= 0, state, pins)


def _matching(state: np.ndarray, coords: np.ndarray) -> list[int] | None:
    """A bijection device -> coordinate row compatible with the pinned ``state``, or None (augmenting paths)."""
    n = len(state)
    fits = ((state[:, None, :] < 0) | (state[:, None, :] == coords[None, :, :])).all(axis=2)
    owner = [-1] * n  # coordinate row -> device

    def augment(d: int, seen: list[bool]) -> bool:
        for p in np.flatnonzero(fits[d]):
            if not seen[p]:
                seen[p] = True
                if owner[p] < 0 or augment(owner[p], seen):
                    owner[p] = d
                    return True
        return False

    for d in range(n):
        if not augment(d, [False] * n):
            return None
    return owner


def search(layouts: Sequence[Layout], num_devices: int) -> tuple[tuple[int, ...], tuple[int, ...], list[dict]] | None:
    """A device order on the prime mesh, and one assignment per layout, that express every layout.

    Returns:
      (axis sizes, device order: the device at each row-major mesh position,
      per layout its assignment grid axis -> mesh axes), or None when no mesh
      can express them all.
    """
    axis_sizes = tuple(prime_factors(num_devices)) or (1,)
    coords = np.array(list(itertools.product(*[range(s) for s in axis_sizes])), dtype=np.int64)
    distinct: dict[tuple, int] = {}
    for layout in layouts:
        distinct.setdefault((layout.grid, layout.shard_devices), len(distinct))
    options: list[list[tuple[dict, np.ndarray]]] = [[] for _ in distinct]
    for (grid, shard_devices), i in distinct.items():
        layout = Layout(grid=grid, shard_devices=shard_devices, rank=0)
        for assignment in assignments([n for _, n in grid], axis_sizes):
            pins = _pins(layout, assignment, axis_sizes, num_devices)
            if pins is not None and _matching(pins, coords) is not None:
                options[i].append((assignment, pins))
        if not options[i]:
            return None
    order = sorted(range(len(options)), key=lambda i: (len(options[i]), -int((options[i][0][1] >= 0).sum())))
    chosen: dict[int, dict] = {}

    def walk(k: int, state: np.ndarray) -> list[int] | None:
        if k == len(order):
            return _matching(state, coords)
        i = order[k]
        for assignment, pins in options[i]:
            merged = _merge(state, pins)
            if merged is None or _matching(merged, coords) is None:
                continue
            chosen[i] = assignment
            found = walk(k + 1, merged)
            if found is not None:
                return found
        return None

    owner = walk(0, np.full((num_devices, len(axis_sizes)), -1, dtype=np.int64))
    if owner is None:
        return None
    per_layout = [chosen[distinct[(layout.grid, layout.shard_devices)]] for layout in layouts]
    return axis_sizes, tuple(owner), per_layout


def search_size(layouts: Sequence[Layout], num_devices: int) -> str:
    """Words for what :func:`search` tried, for error messages."""
    axis_sizes = tuple(prime_factors(num_devices)) or (1,)
    return (
        f"every order of the {num_devices} devices on a mesh of axes {list(axis_sizes)} "
        f"({math.factorial(num_devices):,} orders; every mesh is one of these up to renaming its axes), "
        f"searched exhaustively with pruning over {len({(l.grid, l.shard_devices) for l in layouts})} distinct specs"
    )


def complete_search(layouts: dict[object, Layout], num_devices: int) -> tuple[MeshPlan, dict[object, PSpec]]:
    """The plan and PartitionSpecs of :func:`search`, for :func:`sharding.mesh.mapping.map_specs`.

    Raises:
      MeshMappingError: no mesh exists; names the specs no mesh expresses
        alone, or those that conflict with the specs before them.
    """
    keys = list(layouts)
    found = search([layouts[k] for k in keys], num_devices)
    if found is None:
        raise MeshMappingError(explain_impossible(layouts, num_devices))
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


def explain_impossible(layouts: dict[object, Layout], num_devices: int) -> str:
    """Which specs no mesh expresses: alone, or together with the specs accepted before them."""
    alone = [k for k, layout in layouts.items() if search([layout], num_devices) is None]
    accepted: list = []
    conflicts: list = []
    for key, layout in layouts.items():
        if key in alone:
            continue
        if search([layouts[k] for k in accepted] + [layout], num_devices) is None:
            conflicts.append(key)
        else:
            accepted.append(key)
    lines = [f"  {k}: {describe(layouts[k])} (no mesh expresses it, whatever the other specs)" for k in alone]
    lines += [f"  {k}: {describe(layouts[k])}" for k in conflicts]
    tried = search_size(list(layouts.values()), num_devices)
    return (
        f"{len(alone) + len(conflicts)} sharding spec(s) cannot be expressed as a NamedSharding on "
        "any mesh that also fits the other specs:\n"
        + "\n".join(lines)
        + f"\nTried: the device orders read off the specs, then {tried}; the specs listed are those "
        "that no order fits together with the specs before them (in graph order). "
        "A NamedSharding places shard i of a split axis on a block of the mesh's device array; "
        "reorder the devices of these specs, or run them in another configuration."
    )
