"""Placing a compiled model's parameters on the mesh, once, in every layout its consumers want.

An initializer has no producer (proposal 0007): each consumer takes it in the
spec written for that consumer, or unsharded. Exporters dedupe identical
tensors, so one parameter may feed a column-split Linear and a replicated
LayerNorm, or a LayerNorm that no spec reaches (a ViT's first one, after an
unannotated front end): such a reader reads the whole parameter, never the
split copy of another reader, which XLA would otherwise follow by computing the
norm split and gathering it (an all-gather of its output on CPU, of the
parameter on a TPU). Storing it once in the first consumer's layout would make every
other consumer reshard a constant on every call; instead it is stored once per
distinct layout its consumers ask for, each device receiving only its slice
from the host. The extra copies count in the report's bytes per device.

A copy with a fused-axis placement is held in its unfused shape (JAX can only
shard that view); one whose sharded axes do not divide evenly is held
zero-padded. The traced program slices and reshapes it back.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from onnx2jax.placing import place
from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.runtime.views import View


@dataclasses.dataclass(frozen=True)
class StoredLayout:
    """A stored copy in another shape than ONNX's: unfused and/or zero-padded."""

    logical_shape: tuple[int, ...]
    unfused_shape: tuple[int, ...]
    padded_shape: tuple[int, ...]


def padded_shape(shape: tuple[int, ...], named: NamedSharding) -> tuple[int, ...]:
    """``shape`` rounded up so that every sharded axis divides evenly (the GSPMD ceil rule)."""
    mesh_sizes = dict(named.mesh.shape)
    padded = []
    for size, entry in zip(shape, tuple(named.spec) + (None,) * (len(shape) - len(named.spec))):
        axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        n = math.prod(mesh_sizes[a] for a in axes)
        padded.append(-(-size // n) * n if n > 1 else size)
    return tuple(padded)


def holdable_sharding(shape: tuple[int, ...], named: NamedSharding) -> NamedSharding:
    """``named`` when JAX can hold an array of ``shape`` with it, else replicated on its mesh.

    JAX holds no unevenly sharded array (``device_put`` raises
    IndivisibleError): a value whose spec does not divide its shape moves
    replicated, and the reader's constraint cuts it inside the program.
    """
    if padded_shape(shape, named) == tuple(shape):
        return named
    return NamedSharding(named.mesh, PartitionSpec())


def _whole_copy(distinct: list[TensorPlacement], mesh: Mesh) -> int:
    """The index in ``distinct`` of a replicated, unfused layout, appended when there is none."""
    for index, placement in enumerate(distinct):
        if not placement.fused and placement.sharding.is_fully_replicated:
            return index
    distinct.append(TensorPlacement(NamedSharding(mesh, PartitionSpec())))
    return len(distinct) - 1


class ParameterStore:
    """Every parameter on the mesh, one copy per distinct layout its consumers ask for.

    Attributes:
      arrays: by parameter name, the copy of its first annotated consumer
        (replicated when no consumer has a spec).
      copies: further copies by copy id (``"name#k"``), one per other layout.
      consumer_copy: for each consumer input that reads a further copy, its id
        (a reader without a placement reads the whole parameter: a replicated copy).
      placements: the placement of every stored array (by name or copy id).
      layouts: stored arrays held unfused or padded, by name or copy id.
    """

    def __init__(
        self,
        mesh: Mesh,
        params: Mapping[str, np.ndarray],
        placements: Mapping[SpecKey, TensorPlacement],
        readers: Mapping[str, list[SpecKey]] | None = None,
    ):
        """``readers``: by parameter, every node input that reads it (those without a placement read it whole)."""
        self.arrays: dict[str, jax.Array] = {}
        self.copies: dict[str, jax.Array] = {}
        self.consumer_copy: dict[SpecKey, str] = {}
        self.placements: dict[str, TensorPlacement | None] = {}
        self.layouts: dict[str, StoredLayout] = {}
        wanted: dict[str, list[tuple[SpecKey, TensorPlacement]]] = {}
        for key, placement in placements.items():
            if key.kind == "in" and key.tensor in params:
                wanted.setdefault(key.tensor, []).append((key, placement))
        for name, array in params.items():
            distinct: list[TensorPlacement] = []
            for key, placement in wanted.get(name, []):
                if placement not in distinct:
                    distinct.append(placement)
                index = distinct.index(placement)
                if index:
                    self.consumer_copy[key] = f"{name}#{index}"
            unplaced = [key for key in (readers or {}).get(name, []) if key not in placements]
            if unplaced and distinct:
                index = _whole_copy(distinct, mesh)
                for key in unplaced:
                    if index:
                        self.consumer_copy[key] = f"{name}#{index}"
            self.arrays[name] = self._put(name, array, distinct[0] if distinct else None, mesh)
            for index, placement in enumerate(distinct[1:], start=1):
                self.copies[f"{name}#{index}"] = self._put(f"{name}#{index}", array, placement, mesh)

    def _put(self, key: str, array: np.ndarray, placement: TensorPlacement | None, mesh: Mesh) -> jax.Array:
        self.placements[key] = placement
        if placement is None:
            return place(array, NamedSharding(mesh, PartitionSpec()))
        unfused = array.reshape(placement.expand(array.shape))
        padded = padded_shape(unfused.shape, placement.sharding)
        if placement.fused or padded != unfused.shape:
            self.layouts[key] = StoredLayout(array.shape, unfused.shape, padded)
        return place(unfused, placement.sharding, padded)

    def logical(self, key: str, value: Any) -> Any:
        """The stored ``value`` of ``key`` in its ONNX shape (padding removed, fused axes folded)."""
        layout = self.layouts.get(key)
        if layout is None:
            return value
        if layout.padded_shape != layout.unfused_shape:
            value = value[tuple(slice(0, s) for s in layout.unfused_shape)]
        return value.reshape(layout.logical_shape)

    def view(self, key: str, value: Any) -> View | None:
        """The stored ``value`` of ``key`` as an unfused view, when its placement has one fused axis."""
        layout = self.layouts.get(key)
        placement = self.placements.get(key)
        if layout is None or placement is None or len(placement.fused) != 1:
            return None
        ((axis, sizes),) = placement.fused
        stored = value[tuple(slice(0, s) for s in layout.unfused_shape)]
        return View(stored, layout.logical_shape, axis, len(sizes))

    def notes(self) -> list[str]:
        """One line per parameter stored in another shape, or in several copies."""
        notes = []
        for key, layout in self.layouts.items():
            notes.append(
                f"parameter {key!r} {list(layout.logical_shape)} is stored as {list(layout.padded_shape)} "
                "(unfused and/or padded to divide evenly; see Compiled.params)"
            )
        counts: dict[str, int] = {}
        for copy in self.copies:
            counts[copy.rsplit("#", 1)[0]] = counts.get(copy.rsplit("#", 1)[0], 0) + 1
        for name, extra in counts.items():
            notes.append(
                f"parameter {name!r} is stored in {extra + 1} layouts: its consumers' specs differ, "
                "and a constant is placed once per layout rather than resharded on every call"
            )
        return notes
