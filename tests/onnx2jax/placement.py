"""Checks that a jax.Array sits on the devices the way an ONNX spec says, using sharding.tiles' geometry.

Independent of sharding.mesh.layout: the expected region of every device comes from
``sharding.tiles.device_regions``, the held region from ``addressable_shards``.
"""

from __future__ import annotations

import jax
import numpy as np

from sharding import tiles
from sharding.spec import ShardingSpec


def _held(shard: jax.Shard, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(index.indices(size)[:2] for index, size in zip(shard.index, shape))


def placement_problem(array: jax.Array, spec: ShardingSpec | None, devices=None) -> str | None:
    """Where ``array`` is not held as ``spec`` says, else None.

    Args:
      spec: None for replicated: every device holds the whole array. Otherwise
        only the spec's devices are checked (the others may hold replicas).
      devices: configuration device i is ``devices[i]`` (default ``jax.devices()``).
    """
    devices = list(devices or jax.devices())
    shape = tuple(array.shape)
    by_device = {shard.device: shard for shard in array.addressable_shards}
    whole = tuple((0, n) for n in shape)
    regions = {} if spec is None else tiles.device_regions(spec, shape)
    for config_device in range(len(devices)) if spec is None else regions:
        shard = by_device.get(devices[config_device])
        if shard is None:
            if spec is None:
                continue  # a device outside the array's mesh
            return f"configuration device {config_device} holds no shard"
        expected = whole
        if spec is not None:
            (region,) = regions[config_device]
            expected = tuple(axis[0] if len(axis) == 1 else (0, 0) for axis in region.ranges)
        if _held(shard, shape) != expected:
            return f"device {config_device} holds {_held(shard, shape)}, the spec says {expected}"
    return None


def assert_placed(array: jax.Array, spec: ShardingSpec | None, want: np.ndarray, devices=None, tol: float = 2e-5) -> None:
    """``array`` equals ``want``, each device's shard is its part of it, and it is placed as ``spec`` says."""
    whole_value = np.asarray(array)
    np.testing.assert_allclose(whole_value, want, rtol=tol, atol=tol)
    for shard in array.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), whole_value[shard.index])
    problem = placement_problem(array, spec, devices)
    assert problem is None, problem
