"""Shard geometry: which index ranges each device holds; split and merge host arrays.

Worked example (proposal 0006, corrected; DESIGN point 6): the tensor
``[[1, 2], [3, 4]]`` (shape (2, 2)) with spec ``0:2 @ [{0,1},{2,3}]``.

- Axis 0 has 2 shards of ceil(2 / 2) = 1 row: shard 0 is rows [0, 1), shard 1
  rows [1, 2). Axis 1 is not sharded: columns [0, 2).
- Shard 0 has device entry -1 -> group {0, 1}; shard 1 has -2 -> {2, 3}.
- `device_regions` gives devices 0 and 1 ``Region(shard=0, ranges=(((0, 1),),
  ((0, 2),)))`` and devices 2 and 3 the same with shard 1 and rows (1, 2):
  devices 0, 1 hold ``[[1, 2]]`` and devices 2, 3 hold ``[[3, 4]]``.

With uneven sizes the last blocks are shorter or empty (size 5 in 4 shards:
blocks of 2 give rows [0,2) [2,4) [4,5) and an empty fourth). With a fused
axis a device's part of that axis is several disjoint global ranges, kept in
increasing order in its local array (see `Region.local_global_pairs`).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import EllipsisType

import numpy as np

from sharding import _geometry
from sharding.spec import ShardingSpec

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Region:
    """The part of a tensor that one shard covers.

    Attributes:
        shard: The shard number.
        ranges: Per axis, the global ``[start, stop)`` ranges covered, in
            increasing order; the local array is their concatenation. An axis
            with no range is empty on this shard (uneven sizes).
    """

    shard: int
    ranges: tuple[tuple[Range, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the local array."""
        return tuple(sum(stop - start for start, stop in axis) for axis in self.ranges)

    def indices(self) -> tuple[np.ndarray, ...]:
        """Per axis, the global index of each local position."""
        return tuple(
            np.concatenate(
                [np.arange(start, stop) for start, stop in axis] or [np.zeros(0, np.int64)]
            )
            for axis in self.ranges
        )

    def local_global_pairs(self) -> tuple[tuple[tuple[slice, ...], tuple[slice, ...]], ...]:
        """Pairs of (local slices, global slices) that together cover the region.

        ``local[l] == global_array[g]`` for each pair ``(l, g)``, as in
        nanotron's ``local_global_slices_pairs``. A plain split has one pair.
        """
        per_axis = []
        for axis in self.ranges:
            pairs, offset = [], 0
            for start, stop in axis:
                pairs.append((slice(offset, offset + stop - start), slice(start, stop)))
                offset += stop - start
            per_axis.append(pairs)
        return tuple(
            (tuple(local for local, _ in combo), tuple(glob for _, glob in combo))
            for combo in itertools.product(*per_axis)
        )


def device_regions(spec: ShardingSpec, shape: Sequence[int]) -> dict[int, list[Region]]:
    """The regions each device holds.

    Args:
        spec: The spec.
        shape: The tensor's concrete shape.

    Returns:
        ``{device: [Region, ...]}``, devices sorted, regions in shard order.

    Raises:
        ValueError: The spec does not fit ``shape``.
    """
    layouts = _geometry.axis_layouts(spec, tuple(shape))
    regions: dict[int, list[Region]] = {}
    for shard in range(spec.num_shards):
        ranges = tuple(layout.ranges(layout.block_of_shard(shard)) for layout in layouts)
        for device in spec.devices_of_shard(shard):
            regions.setdefault(device, []).append(Region(shard, ranges))
    return dict(sorted(regions.items()))


def tile_assignment(spec: ShardingSpec, shape: Sequence[int]) -> np.ndarray:
    """The devices of each shard, laid out as the shard grid.

    Args:
        spec: The spec.
        shape: The tensor's concrete shape.

    Returns:
        An object array with one axis per tensor axis, of length that axis's
        number of blocks; entry ``[i, j, ...]`` is the sorted tuple of devices
        holding block ``i`` of axis 0, ``j`` of axis 1, ... Along a fused axis
        the block index is row-major over its sub-axes, so reshaping that axis
        to the sub-axes' shard counts gives the unfused grid.

    Raises:
        ValueError: The spec does not fit ``shape``.
    """
    layouts = _geometry.axis_layouts(spec, tuple(shape))
    numbers = np.zeros((), dtype=np.int64)
    for layout in layouts:
        numbers = np.add.outer(numbers, np.arange(layout.shards) * layout.stride)
    grid = np.empty(numbers.shape, dtype=object)
    for index, shard in np.ndenumerate(numbers):
        grid[index] = tuple(sorted(spec.devices_of_shard(int(shard))))
    return grid


def _index(region: Region) -> tuple[np.ndarray, ...] | EllipsisType:
    indices = region.indices()
    return np.ix_(*indices) if indices else ...


def split_regions(array: np.ndarray, regions: Mapping[int, Region]) -> dict[int, np.ndarray]:
    """Each device's local array, given one region per device.

    Args:
        array: The whole tensor.
        regions: ``{device: Region}``.

    Returns:
        ``{device: local array}`` (copies).
    """
    array = np.asarray(array)
    return {device: np.array(array[_index(region)]) for device, region in regions.items()}


def _equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    same = a == b
    if a.dtype.kind in "fc":
        same |= np.isnan(a) & np.isnan(b)
    return same


def merge_regions(
    shards: Mapping[int, np.ndarray], regions: Mapping[int, Region], shape: Sequence[int]
) -> np.ndarray:
    """Rebuilds the whole tensor from local arrays, given one region per device.

    Replicated copies must agree exactly (NaN agrees with NaN) and every
    element must come from at least one of the local arrays given.

    Args:
        shards: ``{device: local array}``; devices may be left out when their
            data is on another device given.
        regions: ``{device: Region}``.
        shape: The whole tensor's shape.

    Returns:
        The whole tensor.

    Raises:
        ValueError: A device is unknown, a local array has the wrong shape or
            dtype, copies disagree, or an element is on no device given.
    """
    shape = _geometry.check_shape(tuple(shape), "merge")
    unknown = sorted(set(shards) - set(regions))
    if unknown:
        raise ValueError(f"local arrays given for devices {unknown}, which hold no shard")
    if not shards:
        raise ValueError("no local arrays given")
    out: np.ndarray | None = None
    covered = np.zeros(shape, dtype=bool)
    for device in sorted(shards):
        local, region = np.asarray(shards[device]), regions[device]
        if local.shape != region.shape:
            raise ValueError(
                f"device {device} (shard {region.shard}): local array has shape "
                f"{local.shape}, expected {region.shape}"
            )
        if out is None:
            out = np.empty(shape, dtype=local.dtype)
        elif local.dtype != out.dtype:
            raise ValueError(
                f"device {device}: dtype {local.dtype}, other devices have {out.dtype}"
            )
        index = _index(region)
        seen = covered[index]
        mismatch = seen & ~_equal(out[index], local)
        if mismatch.any():
            where = tuple(int(i) for i in np.argwhere(mismatch)[0])
            global_index = tuple(int(g[i]) for g, i in zip(region.indices(), where, strict=True))
            raise ValueError(
                f"device {device} (shard {region.shard}) disagrees with another copy at "
                f"global index {global_index}: {local[where]!r} vs {out[index][where]!r}"
            )
        out[index] = local
        covered[index] = True
    if not covered.all():
        missing = tuple(int(i) for i in np.argwhere(~covered)[0])
        holders = sorted(d for d, r in regions.items() if _contains(r, missing))
        raise ValueError(
            f"element {missing} is on no device given; it is held by devices {holders}"
        )
    assert out is not None
    return out


def _contains(region: Region, index: tuple[int, ...]) -> bool:
    return all(
        any(start <= i < stop for start, stop in axis)
        for axis, i in zip(region.ranges, index, strict=True)
    )


def _one_region_each(spec: ShardingSpec, shape: Sequence[int]) -> dict[int, Region]:
    result = {}
    for device, regions in device_regions(spec, shape).items():
        if len(regions) > 1:
            shards = ", ".join(str(r.shard) for r in regions)
            raise ValueError(
                f"tensor {spec.tensor_name!r}: device {device} holds shards {shards}; "
                "a device can hold one shard of a spec"
            )
        result[device] = regions[0]
    return result


def split(array: np.ndarray, spec: ShardingSpec) -> dict[int, np.ndarray]:
    """Each device's local array of ``array`` under ``spec``.

    Args:
        array: The whole tensor.
        spec: The spec.

    Returns:
        ``{device: local array}``, devices sorted.

    Raises:
        ValueError: The spec does not fit the array, or a device holds more
            than one shard.

    Example:
        >>> split(np.array([[1, 2], [3, 4]]), ShardingSpec.split("X", {1: 2}, [0, 1]))[1]
        array([[2],
               [4]])
    """
    array = np.asarray(array)
    return split_regions(array, _one_region_each(spec, array.shape))


def merge(shards: Mapping[int, np.ndarray], spec: ShardingSpec, shape: Sequence[int]) -> np.ndarray:
    """Rebuilds the whole tensor from the devices' local arrays (see `merge_regions`).

    Raises:
        ValueError: As `merge_regions`, or a device holds more than one shard.
    """
    return merge_regions(shards, _one_region_each(spec, shape), shape)
