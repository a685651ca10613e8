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
        raise _given_mesh_error(failed, layouts, chosen, num_devices)
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


def _given_mesh_error(failed: list, layouts: dict, given: MeshPlan, num_devices: int) -> MeshMappingError:
    """A short error for specs a user's mesh cannot express: how many, the first, and a mesh that works.

    Every failing spec is in the error's ``failures`` and in a note (shown
    with the traceback, ``onnx2jax ... --debug``).
    """
    failures = [(key, describe(layouts[key])) for key in failed]
    try:
        working: MeshPlan | None = map_specs(layouts, num_devices).plan
    except MeshMappingError:
        working = None
    axes = dict(zip(given.axis_names, given.axis_sizes))
    first_key, first_text = failures[0]
    head = (
        f"{len(failed)} of {len(layouts)} sharding specs cannot be a NamedSharding on the given mesh {axes} "
        f"(first: {first_key}: {first_text}); "
    )
    if working is None:
        advice = "no mesh of these devices expresses them all: fix the annotations (onnx2jax check MODEL)"
    else:
        advice = f"a mesh that works: {suggest_mesh(working, given.axis_names)}, or mesh=None to let compile build it"
    error = MeshMappingError(head + advice + " (the error's .failures lists every spec)", failures=failures,
                             working=working)
    error.add_note("specs the given mesh cannot express:\n" + "\n".join(f"  {k}: {t}" for k, t in failures))
    return error


def suggest_mesh(plan: MeshPlan, names: Sequence[str] = ()) -> str:
    """How a user builds ``plan`` with jax: ``jax.make_mesh((4, 2), ('model', 'd1'))``, plus ``devices=`` if needed.

    The axis names reuse ``names`` (the user's) in order, then ``d1``, ``d2``...
    A configuration device sits at the flat mesh position ``devices=`` gives
    it (row-major by default), so a device order other than the identity is
    said as the ``devices=`` argument of compile.
    """
    chosen = [names[i] if i < len(names) else f"d{i}" for i in range(len(plan.axis_sizes))]
    sizes = ", ".join(map(str, plan.axis_sizes)) + ("," if len(plan.axis_sizes) == 1 else "")
    text = f"jax.make_mesh(({sizes}), ({', '.join(map(repr, chosen))}{',' if len(chosen) == 1 else ''}))"
    if list(plan.device_order) != list(range(len(plan.device_order))):
        positions = [0] * len(plan.device_order)
        for position, device in enumerate(plan.device_order):
            positions[device] = position
        text += f" with devices={positions}"
    return text
