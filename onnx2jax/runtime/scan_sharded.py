"""Scanned layers in a sharded program: one spec for every layer, stacked parameters placed once.

A ``lax.scan`` body is traced once, so every layer runs with the first
layer's sharding constraints. That is only the model's plan when each layer's
nodes carry the same specs as the first layer's (a Megatron plan does); then
each stacked parameter is placed with its first-layer spec behind a new,
unsplit leading axis, and the compiled while loop's body holds one layer's
collectives. When the layers' specs differ, or a stacked parameter is stored
unfused, padded or in several layouts (:mod:`onnx2jax.runtime.parameters`), the
layers stay unrolled and :func:`layer_specs_differ` says why.
"""

from __future__ import annotations

import re
from typing import Callable, Mapping

import jax
import numpy as np
import onnx
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.runtime.parameters import padded_shape
from onnx2jax.scan import ScanPlan, Stacked


def _describe(placement: TensorPlacement | None) -> str:
    if placement is None:
        return "without a spec"
    return f"as {placement.sharding.spec}" + (f" (fused {placement.fused})" if placement.fused else "")


def layer_specs_differ(
    proto: onnx.ModelProto, plan: ScanPlan, placements: Mapping[SpecKey, TensorPlacement],
    params: Mapping[str, np.ndarray],
) -> str:
    """Why the scanned layers cannot share the first layer's specs ('' when they can)."""
    rep = plan.repetition
    nodes = proto.graph.node
    for k in range(1, rep.count):
        for i0, ik in zip(rep.layer_nodes(0), rep.layer_nodes(k)):
            n0, nk = nodes[i0], nodes[ik]
            for kind, first, other in (("in", n0.input, nk.input), ("out", n0.output, nk.output)):
                for position, (a, b) in enumerate(zip(first, other)):
                    p0 = placements.get(SpecKey(n0.name, kind, position, a))
                    pk = placements.get(SpecKey(nk.name, kind, position, b))
                    if p0 != pk:
                        return (
                            f"node {nk.name!r} {kind}put {position} ({b!r}) of layer {k} is placed {_describe(pk)}, "
                            f"the first layer's node {n0.name!r} {_describe(p0)}: a scan runs every layer with the "
                            "first layer's specs"
                        )
    for slot in rep.stacked:
        found = stacked_placements(proto, plan, placements).get(slot, ())
        if len(set(found)) > 1:
            return f"parameter {slot!r} is read in {len(set(found))} layouts by the first layer's nodes (stored once per layout)"
        placement = found[0] if found else None
        if placement is not None and placement.fused:
            return f"parameter {slot!r} is placed with a fused axis (stored unfused), which the stacked copy does not support"
        if placement is not None and padded_shape(params[slot].shape, placement.sharding) != tuple(params[slot].shape):
            return f"parameter {slot!r} {list(params[slot].shape)} does not divide evenly by its spec {placement.sharding.spec}"
    return ""


def stacked_placements(
    proto: onnx.ModelProto, plan: ScanPlan, placements: Mapping[SpecKey, TensorPlacement]
) -> dict[str, tuple[TensorPlacement | None, ...]]:
    """For each stacked slot, the placements its first-layer readers ask for."""
    found: dict[str, list[TensorPlacement | None]] = {}
    for i in plan.repetition.layer_nodes(0):
        node = proto.graph.node[i]
        for position, name in enumerate(node.input):
            if name in plan.repetition.stacked:
                found.setdefault(name, []).append(placements.get(SpecKey(node.name, "in", position, name)))
    return {k: tuple(v) for k, v in found.items()}


def stacked_shardings(
    proto: onnx.ModelProto,
    plan: ScanPlan,
    placements: Mapping[SpecKey, TensorPlacement],
    mesh: jax.sharding.Mesh,
) -> dict[str, NamedSharding]:
    """Each stacked parameter's sharding (by stacked key): its first-layer spec behind an unsplit layer axis."""
    readers = stacked_placements(proto, plan, placements)
    found = {}
    for slot in plan.repetition.stacked:
        placement = (readers.get(slot) or (None,))[0]
        spec = PartitionSpec(None, *(placement.sharding.spec if placement is not None else ()))
        found[plan.stacked_key(slot)] = NamedSharding(mesh, spec)
    return found


def place_stacked(stacked: Mapping[str, Stacked], shardings: Mapping[str, NamedSharding]) -> dict[str, jax.Array]:
    """Each stacked parameter placed with its planned sharding (:func:`stacked_shardings`)."""
    return {key: stacked[key].place(sharding) for key, sharding in shardings.items()}


_COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")


def loop_collectives(
    hlo: str, count: Callable[[str], dict[str, int]]
) -> tuple[dict[str, int], dict[str, int], int] | None:
    """Collectives of compiled HLO text with one while loop of known trip count, split around the loop.

    ``count`` counts collectives in HLO text (``onnx2jax.runtime.spmd.count_collectives``).

    Returns:
      (outside the loop's body, in its body, the trip count), or None when the
      program has no single while loop with a known trip count.
    """
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo.splitlines():
        match = _COMPUTATION.match(line)
        if match:
            current = computations.setdefault(match.group(1), [])
        elif line == "}":
            current = None
        elif current is not None:
            current.append(line)
    whiles = [line for lines in computations.values() for line in lines if " while(" in line]
    if len(whiles) != 1:
        return None
    body = re.search(r"body=%([^,\s]+)", whiles[0])
    trip = re.search(r'known_trip_count":\{"n":"(\d+)"', whiles[0])
    if body is None or trip is None or body.group(1) not in computations:
        return None
    inside = count("\n".join(computations[body.group(1)]))
    outside = count("\n".join(line for name, lines in computations.items() if name != body.group(1) for line in lines))
    return outside, inside, int(trip.group(1))
