"""Where a decoder's KV cache lives, and the tensor-parallel plan a generation handle writes for it.

:func:`write_plan` writes the Megatron plan (:mod:`sharding.megatron`: heads split over the devices, key/value
projections with fewer heads than devices replicated or grouped) and the cache's own specs into the model the
handle opened (in place: its weights are still on disk, nothing is copied), with the shapes of the handle's one
shape inference. The plan is then compiled as one SPMD program through the front door's plan
(:mod:`onnx2jax.runtime.load`).

The cache ``[batch, kv_heads, positions, head_size]`` is split on its heads axis (:func:`cache_ways`): over every
device when they divide the KV heads (each holds 1/N of it); over the largest divisor of the devices that
divides the KV heads when they do not (GPT-2's 12 heads at 8 devices: 4 ways, each part on 2 devices, as the
Megatron plan splits the attention's heads); with more devices than KV heads it is placed as the plan places
the key/value projections (whole on every device, or split in as many parts as KV heads). ``note`` says which.

:class:`CachePlacement` makes the cache where the compiled program places its past inputs, with no host copy.
"""

from __future__ import annotations

import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from sharding.annotate import set_specs

from onnx2jax.runtime.kv_cache import CacheLayout
from onnx2jax.runtime.placement_keys import TensorPlacement
from onnx2jax.runtime.placements import input_placements, input_sharding
from onnx2jax.runtime.spmd import Compiled

CONFIGURATION = "tp"
"""The device configuration the Megatron plan and the cache's specs are written in."""


def write_plan(model: onnx.ModelProto, layout: CacheLayout, devices: int, shapes: Mapping[str, tuple]) -> None:
    """Writes the Megatron plan over ``devices`` and the cache's specs into ``model`` itself (named nodes,
    ``shapes`` its inferred tensor shapes)."""
    # tensor-parallel only: the Megatron planner is not imported on one device's path
    from sharding.megatron.plan import megatron_layout, write_megatron_plan

    write_megatron_plan(model, megatron_layout(model, devices, shapes=shapes), CONFIGURATION)
    ways = cache_ways(layout, devices)
    if ways > 1:
        annotate_cache(model, layout, ways, devices)


def cache_ways(layout: CacheLayout, devices: int) -> int:
    """In how many parts the cache's KV heads are written split over ``devices``: all of them where they divide
    the heads, else the largest divisor of ``devices`` that divides the heads (each part then on
    ``devices / ways`` devices, as the Megatron plan splits heads); 0 where there are fewer KV heads than
    devices (the plan's placement of the key/value projections decides)."""
    heads = layout.kv_heads
    if heads is None or heads < devices:
        return 0
    return max(w for w in range(1, devices + 1) if devices % w == 0 and heads % w == 0)


def annotate_cache(model: onnx.ModelProto, layout: CacheLayout, ways: int, devices: int) -> None:
    """Writes the cache's spec (heads axis in ``ways`` shards over ``devices``) on every node that reads a past or
    writes a present (in place), so that the program takes and gives the cache sharded, as the loop holds it."""
    from sharding.megatron.specs import split_spec  # tensor-parallel only, as write_plan's

    cache = set(layout.past) | set(layout.present)
    specs = (
        (node.name, split_spec(tensor, 1, ways, devices))
        for node in model.graph.node
        for tensor in dict.fromkeys([*node.input, *node.output])  # the node's order: the same model every run
        if tensor in cache
    )
    set_specs(model, specs, CONFIGURATION)


class CachePlacement:
    """Where a decoder's cache lives: as the compiled program places its past inputs at the decode step's
    shapes (the plan's specs, and the cache's own where :func:`cache_ways` splits it), so that a step's
    presents go back in with no resharding.

    Attributes:
      devices: the tensor-parallel width (the mesh's size; 1 on one device).
      cache_ways: in how many parts the cache's KV heads are split (1: whole on every device).
      note: where the cache is not split over every device, how it is placed; else "".
    """

    def __init__(self, compiled: Compiled, layout: CacheLayout):
        self._compiled = compiled
        self.layout = layout
        self.devices = int(compiled.mesh.devices.size)
        self._shardings: dict[tuple[int, ...], jax.sharding.Sharding] = {}
        self.cache_ways, self.note = 1, ""
        plan = compiled.plan
        # the past's placement in the plan at the model's own shapes (its heads axis is fixed), when it has one
        self._planned = input_placements(plan.proto, plan.placements).get(layout.past[0]) if layout.past else None
        if layout.past and layout.kv_heads is not None and self.devices > 1:
            self.cache_ways = _heads_ways(compiled, self._planned)
            self.note = _note(layout.kv_heads, self.cache_ways, self.devices)

    def _sharding(self, batch: int, capacity: int) -> jax.sharding.Sharding:
        """The cache's sharding at ``[batch, kv_heads, capacity, head_size]`` (the decode step's inputs' shapes)."""
        layout = self.layout
        shape = (batch, layout.kv_heads, capacity, layout.head_size)
        found = self._shardings.get(shape)
        if found is None and (self._compiled.inference is None or (self._planned and not self._planned.fused)):
            # unannotated (replicated), or planned at the model's shapes: no inference at the decode step's shapes
            found = self._shardings[shape] = input_sharding(shape, self._planned, self._compiled.mesh)
        if found is None:
            width = capacity if layout.kind == "shared" else capacity + 1  # the concat kind's mask: past + new
            shapes = {name: shape for name in layout.past}
            for name, dims in ((layout.input_ids, (batch, 1)), (layout.position_ids, (batch, 1)),
                               (layout.attention_mask, (batch, width))):
                if name is not None:
                    shapes[name] = dims
            found = self._shardings[shape] = self._compiled.input_shardings(shapes)[layout.past[0]]
        return found

    def zeros_cache(self, batch: int, capacity: int) -> tuple[jax.Array, ...]:
        """Zeros for every cache input ``[batch, kv_heads, capacity, head_size]`` (a ring cache's positions at
        most its window and slack: ``CacheLayout.capacities``), made on the devices where the program places its
        past inputs (each device makes its own part: no host copy)."""
        layout = self.layout
        dtype = jnp.dtype(layout.dtype)
        shapes = layout.cache_shapes(batch, capacity)
        return tuple(_zeros(shape, dtype, self._sharding(batch, shape[2])) for shape in shapes)

    def abstract_cache(self, batch: int, capacity: int) -> tuple[jax.ShapeDtypeStruct, ...]:
        """:meth:`zeros_cache` without data: each cache input's shape, dtype and sharding (lowering for a
        target whose devices are not attached)."""
        dtype = jnp.dtype(self.layout.dtype)
        return tuple(jax.ShapeDtypeStruct(shape, dtype, sharding=self._sharding(batch, shape[2]))
                     for shape in self.layout.cache_shapes(batch, capacity))

    def constrain_cache(self, array: jax.Array) -> jax.Array:
        """``array`` (a present) placed as the cache of its shape is (see :meth:`zeros_cache`)."""
        return jax.lax.with_sharding_constraint(array, self._shardings[tuple(array.shape)])


def _heads_ways(compiled: Compiled, placement: TensorPlacement | None) -> int:
    """In how many parts the plan's ``placement`` of a past input splits its heads axis."""
    if placement is None or placement.fused:
        return 1
    axes = placement.sharding.spec[1] if len(placement.sharding.spec) > 1 else None
    if axes is None:
        return 1
    sizes = compiled.mesh.shape
    return math.prod(sizes[a] for a in ((axes,) if isinstance(axes, str) else axes))


def _zeros(shape: tuple[int, ...], dtype: jnp.dtype, sharding: jax.sharding.Sharding) -> jax.Array:
    """Zeros of ``shape`` placed with ``sharding``, each device given its own part from the host (zeros the
    kernel maps lazily): no full host copy, and no program compiled (a jitted ``jnp.zeros`` compiled one per
    shape, ~40 ms of the first token)."""
    def part(index: tuple[slice, ...]) -> np.ndarray:
        return np.zeros(tuple(len(range(*s.indices(n))) for s, n in zip(index, shape)), dtype)

    return jax.make_array_from_callback(shape, sharding, part)


def _note(kv_heads: int, ways: int, devices: int) -> str:
    if ways == devices:
        return ""
    if ways == 1:
        return (
            f"the cache has {kv_heads} KV head(s), fewer than the {devices} devices: it is whole on every device, "
            "as the key/value projections are"
        )
    if kv_heads > devices:
        return (
            f"the cache has {kv_heads} KV heads, which {devices} devices do not divide: split {ways} ways by KV "
            f"heads (the largest divisor of {devices} that divides {kv_heads}), each part on {devices // ways} "
            "devices"
        )
    return (
        f"the cache has {kv_heads} KV heads, fewer than the {devices} devices: split {ways} ways by KV heads, "
        f"each part on {devices // ways} devices"
    )


def cache_bytes_per_device(cache: tuple[jax.Array, ...]) -> int:
    """Bytes of the cache one device holds (its first device's shards)."""
    device = cache[0].addressable_shards[0].device
    return int(sum(s.data.nbytes for c in cache for s in c.addressable_shards if s.device == device))


__all__ = ["CONFIGURATION", "CachePlacement", "annotate_cache", "cache_bytes_per_device", "cache_ways", "write_plan"]
