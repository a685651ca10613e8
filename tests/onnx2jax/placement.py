"""Checks that a jax.Array sits on the devices the way an ONNX spec says, using sharding.tiles' geometry.

Independent of onnx2jax.mesh: the expected region of every device comes from
``sharding.tiles.device_regions``, the held region from ``addressable_shards``.
"""

from __future__ import annotations

import jax
import numpy as np

from sharding import tiles
from sharding.spec import ShardingSpec


def _held(shard: jax.Shard, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(index.indices(size)[:2] for index, size in zip(shard.index, shape))


def assert_placed(array: jax.Array, spec: ShardingSpec | None, want: np.ndarray, devices=None, tol: float = 2e-5) -> None:
    """``array`` equals ``want`` and each configuration device holds its region of ``spec``.

    Args:
      spec: None for replicated: every device holds the whole array.
      devices: configuration device i is ``devices[i]`` (default ``jax.devices()``).
    """
    devices = list(devices or jax.devices())
    shape = tuple(array.shape)
    whole_value = np.asarray(array)
    np.testing.assert_allclose(whole_value, want, rtol=tol, atol=tol)
    by_device = {shard.device: shard for shard in array.addressable_shards}
    whole = tuple((0, n) for n in shape)
    regions = {} if spec is None else tiles.device_regions(spec, shape)
    for config_device in range(len(devices)) if spec is None else regions:
        shard = by_device.get(devices[config_device])
        assert shard is not None, f"configuration device {config_device} holds no shard"
        expected = whole
        if spec is not None:
            (region,) = regions[config_device]
            expected = tuple(axis[0] if len(axis) == 1 else (0, 0) for axis in region.ranges)
        assert _held(shard, shape) == expected, (
            f"device {config_device}: holds {_held(shard, shape)}, the spec says {expected}"
        )
        np.testing.assert_array_equal(np.asarray(shard.data), whole_value[shard.index])
