"""ONNX sharding specs -> one jax Mesh and a PartitionSpec per spec (how: :mod:`sharding.mesh.layout`).

`map_specs` tries the device orders read off the specs on the prime mesh, falls back on the complete
search of :mod:`sharding.mesh.search`, and merges the mesh axes every PartitionSpec uses together.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Sequence

from sharding.mesh.layout import Layout, MeshMappingError, MeshPlan, PSpec, describe, find_pspec, prime_factors
from sharding.mesh.search import complete_search


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
        chosen, pspecs = complete_search(layouts, num_devices)
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


def _explain_failures(failed: list, layouts: dict, plan: MeshPlan) -> str:
    """Names the specs a given mesh cannot express."""
    lines = [f"  {key}: {describe(layouts[key])}" for key in failed]
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
