"""Tensor-parallel generation: the model under a Megatron plan, the KV cache sharded by KV heads.

:class:`Placement` annotates the decoder with :func:`sharding.megatron.megatron_plan` (heads split over the
devices; key/value projections with fewer heads than devices replicated) and the cache's own specs, and
compiles it as one SPMD program from the runtime's plan (:func:`onnx2jax.runtime.plan.make_plan`); the
generation loop runs that program's pure ``apply`` inside its own prefill and decode programs. The cache ``[batch, kv_heads, positions, head_size]`` is sharded on its heads axis when
the devices divide the KV heads (each device holds 1/N of it); with more devices than KV heads it is
replicated (``note`` says so), as its projections are; KV heads more than the devices but not divisible
by them cannot be split, and are refused by name.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

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

    Attributes:
      compiled: the Megatron-annotated model compiled as one SPMD program.
      mesh: its mesh.
      devices: the tensor-parallel width (the mesh's size).
      cache_sharding: the cache's NamedSharding (heads axis split, or replicated).
      note: why the cache is replicated, or "".
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
        self.cache_spec, self.note = cache_spec(layout, size)
        if isinstance(model, (str, os.PathLike)):
            model = load_model(model)  # with its external data: the annotated copy is compiled from memory
        annotated = megatron_plan(model, size, CONFIGURATION)
        if "heads" in self.cache_spec:
            annotate_cache(annotated, layout, size)
        self.compiled = compile_program(annotated, mesh)
        self.mesh = self.compiled.mesh
        axes = tuple(self.mesh.axis_names)
        spec = PartitionSpec(*(axes if a == "heads" else None for a in self.cache_spec))
        self.cache_sharding = NamedSharding(self.mesh, spec)

    def apply(self, params, **named) -> tuple:
        """The sharded model as a pure function (``Compiled.apply``)."""
        return self.compiled.apply(params, **named)

    def params(self) -> dict[str, jax.Array]:
        return self.compiled.params

    def zeros_cache(self, count: int, shape: tuple[int, ...], dtype: Any) -> tuple[jax.Array, ...]:
        """``count`` zero cache arrays of ``shape``, each placed with :attr:`cache_sharding`."""
        make = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=self.cache_sharding)
        return tuple(make() for _ in range(count))

    def constrain_cache(self, array: jax.Array) -> jax.Array:
        return jax.lax.with_sharding_constraint(array, self.cache_sharding)

    def jit(self, fn: Callable, donate: tuple[int, ...]) -> Callable:
        return jax.jit(fn, donate_argnums=donate)


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


def cache_spec(layout: CacheLayout, devices: int) -> tuple[tuple[str | None, ...], str]:
    """The cache's layout over ``devices``: ``(None, "heads", None, None)`` or all None, and a note where
    the cache is replicated.

    Raises:
      ValueError: the KV heads are more than the devices but not a multiple of them (naming both).
    """
    heads = layout.kv_heads
    if heads is None:
        return (None,) * 4, "the cache's KV heads are not fixed by the graph: the cache is replicated"
    if heads % devices == 0:
        return (None, "heads", None, None), ""
    if heads < devices:
        return (None,) * 4, (
            f"the cache has {heads} KV head(s), fewer than the {devices} devices: it is replicated on every "
            f"device, as the key/value projections are"
        )
    raise ValueError(
        f"the cache has {heads} KV heads ({layout.source}), which {devices} devices cannot split evenly: "
        f"give a number of devices that divides {heads}, or more devices than KV heads (the cache is then "
        "replicated)"
    )


def cache_bytes_per_device(cache: tuple[jax.Array, ...]) -> int:
    """Bytes of the cache one device holds (its first device's shards)."""
    device = cache[0].addressable_shards[0].device
    return int(sum(s.data.nbytes for c in cache for s in c.addressable_shards if s.device == device))


__all__ = ["Placement", "cache_bytes_per_device", "cache_spec"]
