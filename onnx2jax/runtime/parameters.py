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

from onnx2jax.loading import host_array
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
    """Every parameter's stored layout on the mesh, one copy per distinct layout its consumers ask for.

    Planning and placing are two steps: the constructor reads only each
    parameter's shape and dtype (never its values), so a store can be made for
    a mesh of compile-only devices (a TPU topology) and give the program's
    abstract parameters (:meth:`abstract`); :meth:`place` then puts host
    arrays on the mesh, each device receiving only its slice.

    Attributes:
      mesh: the mesh every layout is on.
      names: by stored key (a parameter's name, or a copy id ``"name#k"``), the parameter it holds.
      consumer_copy: for each consumer input that reads a further copy, its id
        (a reader without a placement reads the whole parameter: a replicated copy).
      placements: the placement of every stored array (by name or copy id).
      layouts: stored arrays held unfused or padded, by name or copy id.
      shardings: the NamedSharding of every stored array.
      held: by stored key, the (shape, dtype) it is held in.
    """

    def __init__(
        self,
        mesh: Mesh,
        params: Mapping[str, Any],
        placements: Mapping[SpecKey, TensorPlacement],
        readers: Mapping[str, list[SpecKey]] | None = None,
    ):
        """``params``: by name, anything with ``shape`` and ``dtype`` (host arrays, ShapeDtypeStructs); no value is
        read. ``readers``: by parameter, every node input that reads it (those without a placement read it whole)."""
        self.mesh = mesh
        self.names: dict[str, str] = {}
        self.consumer_copy: dict[SpecKey, str] = {}
        self.placements: dict[str, TensorPlacement | None] = {}
        self.layouts: dict[str, StoredLayout] = {}
        self.shardings: dict[str, NamedSharding] = {}
        self.held: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
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
            shape, dtype = tuple(array.shape), np.dtype(array.dtype)
            self._plan(name, name, shape, dtype, distinct[0] if distinct else None)
            for index, placement in enumerate(distinct[1:], start=1):
                self._plan(f"{name}#{index}", name, shape, dtype, placement)

    def _plan(self, key: str, name: str, shape: tuple[int, ...], dtype: np.dtype,
              placement: TensorPlacement | None) -> None:
        self.names[key] = name
        self.placements[key] = placement
        if placement is None:
            self.shardings[key] = NamedSharding(self.mesh, PartitionSpec())
            self.held[key] = (shape, dtype)
            return
        unfused = tuple(placement.expand(shape))
        padded = padded_shape(unfused, placement.sharding)
        if placement.fused or padded != unfused:
            self.layouts[key] = StoredLayout(shape, unfused, padded)
        self.shardings[key] = placement.sharding
        self.held[key] = (padded, dtype)

    @property
    def copy_keys(self) -> list[str]:
        """The further copies' ids (``"name#k"``), in order."""
        return [key for key in self.names if key != self.names[key]]

    def abstract(self) -> tuple[dict[str, jax.ShapeDtypeStruct], dict[str, jax.ShapeDtypeStruct]]:
        """(by name, by copy id): every stored array as a ShapeDtypeStruct with its sharding, no data."""
        structs = {
            key: jax.ShapeDtypeStruct(shape, dtype, sharding=self.shardings[key])
            for key, (shape, dtype) in self.held.items()
        }
        copies = set(self.copy_keys)
        return ({k: v for k, v in structs.items() if k not in copies}, {k: v for k, v in structs.items() if k in copies})

    def place(self, params: Mapping[str, np.ndarray]) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """(by name, by copy id): the host ``params`` placed in their planned layouts, each device reading its slice."""
        arrays: dict[str, jax.Array] = {}
        copies: dict[str, jax.Array] = {}
        for key, name in self.names.items():
            array = host_array(params[name])
            if key in self.layouts:
                array = array.reshape(self.layouts[key].unfused_shape)
            placed = place(array, self.shardings[key], self.held[key][0])
            (arrays if key == name else copies)[key] = placed
        return arrays, copies

    def held_on_host(self, key: str, params: Mapping[str, np.ndarray]) -> np.ndarray:
        """The stored array ``key`` as a host array in its held shape (unfused, zero-padded), read from ``params``."""
        array = np.asarray(host_array(params[self.names[key]]))
        layout = self.layouts.get(key)
        if layout is None:
            return array
        unfused = array.reshape(layout.unfused_shape)
        if layout.padded_shape == layout.unfused_shape:
            return unfused
        return np.pad(unfused, [(0, p - u) for p, u in zip(layout.padded_shape, layout.unfused_shape)])

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
        for copy in self.copy_keys:
            counts[copy.rsplit("#", 1)[0]] = counts.get(copy.rsplit("#", 1)[0], 0) + 1
        for name, extra in counts.items():
            notes.append(
                f"parameter {name!r} is stored in {extra + 1} layouts: its consumers' specs differ, "
                "and a constant is placed once per layout rather than resharded on every call"
            )
        return notes
