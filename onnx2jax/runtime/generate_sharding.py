"""Tensor-parallel generation: the model under a Megatron plan, the KV cache sharded by KV heads.

:class:`Placement` annotates the decoder with :func:`sharding.megatron.megatron_plan` (heads split over the
devices; key/value projections with fewer heads than devices replicated) and the cache's own specs, and
compiles it as one SPMD program from the runtime's plan (:func:`onnx2jax.runtime.plan.make_plan`); the
generation loop runs that program's pure ``apply`` inside its own prefill and decode programs. The cache ``[batch, kv_heads, positions, head_size]`` is sharded on its heads axis when
the devices divide the KV heads (each device holds 1/N of it); with more devices than KV heads it is
placed as the plan places the key/value projections (whole on every device, or split in as many parts as
KV heads; ``note`` says which); KV heads more than the devices but not divisible by them cannot be split,
and are refused by name.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import numpy as np
import onnx
from jax.sharding import Mesh

from sharding.annotate import set_spec
from sharding.spec import ShardingSpec

from onnx2jax.runtime.kv_cache import CacheLayout
from onnx2jax.runtime.plan import make_plan
from onnx2jax.runtime.spmd import Compiled
from onnx2jax.translate import JaxModel

CONFIGURATION = "tp"
"""The device configuration the Megatron plan and the cache's specs are written in."""


class Placement:
    """Where a sharded decoder's parameters and cache live, and its sharded forward.

    The cache is placed as the compiled program places its past inputs (the Megatron plan's specs, and the
    cache's own where :func:`cache_splits` splits it), so that a step's presents go back in with no
    resharding.

    Attributes:
      compiled: the Megatron-annotated model compiled as one SPMD program.
      mesh: its mesh.
      devices: the tensor-parallel width (the mesh's size).
      cache_ways: in how many parts the cache's KV heads are split (1: whole on every device).
      note: where the cache is not split over every device, how it is placed; else "".
    """

    def __init__(self, model: str | os.PathLike | Any, layout: CacheLayout, *, devices: int | None, mesh: Mesh | None):
        from sharding.megatron import megatron_plan

        from onnx2jax.loading import load_model

        size = mesh.devices.size if mesh is not None else int(devices or 0)
        if devices and mesh is not None and devices != size:
            raise ValueError(f"devices={devices} but the mesh has {size} devices: give one of them")
        if size < 2:
            raise ValueError(f"tensor-parallel generation needs 2 or more devices, got {size}")
        have = len(jax.devices())
        if mesh is None and size > have:
            raise ValueError(f"devices={size} but JAX has {have} devices")
        self.devices = size
        self.layout = layout
        split = cache_splits(layout, size)
        if isinstance(model, (str, os.PathLike)):
            model = load_model(model)  # with its external data: the annotated copy is compiled from memory
        annotated = megatron_plan(model, size, CONFIGURATION)
        if split:
            annotate_cache(annotated, layout, size)
        self.compiled = compile_program(annotated, mesh)
        self.mesh = self.compiled.mesh
        self._shardings: dict[tuple[int, ...], jax.sharding.Sharding] = {}
        probe = self.zeros_cache(1, 2)[0]
        self.cache_ways = layout.kv_heads // probe.sharding.shard_shape(probe.shape)[1] if layout.kv_heads else 1
        self.note = _note(layout.kv_heads, self.cache_ways, size)

    def apply(self, params, **named) -> tuple:
        """The sharded model as a pure function (``Compiled.apply``)."""
        return self.compiled.apply(params, **named)

    def params(self) -> dict[str, jax.Array]:
        return self.compiled.params

    def zeros_cache(self, batch: int, capacity: int) -> tuple[jax.Array, ...]:
        """Zeros for every cache input ``[batch, kv_heads, capacity, head_size]``, placed as the program
        places its past inputs at the decode step's shapes."""
        layout = self.layout
        capacities = dict(zip(layout.past, layout.capacities(capacity)))  # ring caches are shorter
        dummies = {
            n: np.zeros((batch, layout.kv_heads, capacities[n], layout.head_size), layout.dtype) for n in layout.past
        }
        width = capacity if layout.kind == "shared" else capacity + 1  # the concat kind's mask spans past + new
        for name, info in ((layout.input_ids, (batch, 1)), (layout.position_ids, (batch, 1)),
                           (layout.attention_mask, (batch, width))):
            if name is not None:
                dummies[name] = np.zeros(info, np.int64)
        dummies = {k: v.astype(self._dtypes[k]) for k, v in dummies.items()}
        placed = self.compiled.place_inputs(**dummies)
        cache = tuple(placed[name] for name in layout.past)
        self._shardings.update((tuple(c.shape), c.sharding) for c in cache)
        return cache

    @property
    def _dtypes(self) -> dict[str, np.dtype]:
        return {i.name: i.dtype for i in self.compiled.model.inputs}

    def constrain_cache(self, array: jax.Array) -> jax.Array:
        """``array`` (a present) placed as the cache of its shape is (see :meth:`zeros_cache`)."""
        return jax.lax.with_sharding_constraint(array, self._shardings[tuple(array.shape)])

    def jit(self, fn: Callable, donate: tuple[int, ...]) -> Callable:
        return jax.jit(fn, donate_argnums=donate)


def _note(kv_heads: int | None, ways: int, devices: int) -> str:
    if ways == devices:
        return ""
    if ways == 1:
        return (
            f"the cache has {kv_heads} KV head(s), fewer than the {devices} devices: it is whole on every device, "
            "as the key/value projections are"
        )
    return (
        f"the cache has {kv_heads} KV heads, fewer than the {devices} devices: split {ways} ways by KV heads, "
        f"each part on {devices // ways} devices"
    )


def compile_program(model: onnx.ModelProto, mesh: Mesh | None) -> Compiled:
    """The annotated decoder as one SPMD program (a generation loop takes a whole-model plan only).

    Raises:
      ValueError: the model has pipeline stages or data-dependent shapes (a plan of another kind).
    """
    plan = make_plan(model, mesh, configuration=CONFIGURATION, scan_layers=False)
    if plan.kind != "whole":
        raise ValueError(f"generation runs a decoder as one program; this model's plan is of kind {plan.kind!r}")
    return Compiled(JaxModel(plan.proto, plan.external_dir, scan_layers=False, inferred=plan.inferred), plan.program)


def annotate_cache(model: onnx.ModelProto, layout: CacheLayout, devices: int) -> None:
    """Writes the cache's spec (heads axis in ``devices`` shards) on every node that reads a past or writes a
    present (in place), so that the program takes and gives the cache sharded, as the loop holds it."""
    cache = set(layout.past) | set(layout.present)
    for node in model.graph.node:
        for tensor in {*node.input, *node.output} & cache:
            set_spec(model, node.name, ShardingSpec.split(tensor, {1: devices}, range(devices)), CONFIGURATION)


def cache_splits(layout: CacheLayout, devices: int) -> bool:
    """Whether the cache's KV heads split evenly over ``devices`` (then each device holds 1/devices of it);
    with more devices than KV heads, the Megatron plan's placement of the key/value projections decides.

    Raises:
      ValueError: the KV heads are more than the devices but not a multiple of them (naming both).
    """
    heads = layout.kv_heads
    if heads is None or heads < devices:
        return False
    if heads % devices == 0:
        return True
    raise ValueError(
        f"the cache has {heads} KV heads ({layout.source}), which {devices} devices cannot split evenly: "
        f"give a number of devices that divides {heads}, or more devices than KV heads"
    )


def cache_bytes_per_device(cache: tuple[jax.Array, ...]) -> int:
    """Bytes of the cache one device holds (its first device's shards)."""
    device = cache[0].addressable_shards[0].device
    return int(sum(s.data.nbytes for c in cache for s in c.addressable_shards if s.device == device))


__all__ = ["Placement", "cache_bytes_per_device", "cache_splits"]
