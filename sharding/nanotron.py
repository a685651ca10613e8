"""nanotron's `SplitConfig` and its ONNX equivalent.

nanotron shards a parameter along ``split_dim`` *inside each* of its
``contiguous_chunks``: with chunks (100, 100) over 2 ranks, rank 0 holds
global [0, 50) and [100, 150), rank 1 holds [50, 100) and [150, 200), each in
that order locally. (Chunks exist so that ``torch.split(y, out)`` of a fused
gate/up projection still works on every rank.)

Equal chunks are exactly an ONNX fused axis: m chunks of c are the sub-axes
[m, c] with 1 and N shards, so `spec_from_split_config` returns that spec.
Unequal chunks (a fused q/k/v projection under GQA: (64, 16, 16)) have no
ONNX equivalent, since a fused axis views the axis as a row-major grid, whose
rows all have one length. For them `ChunkedSplit` gives the geometry, split
and merge, and `contiguous_permutation` the reordering of the axis after
which a plain split is the same sharding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim
from sharding.tiles import Region, merge_regions, split_regions


@dataclass(frozen=True, slots=True)
class SplitConfig:
    """nanotron's split of a parameter.

    Attributes:
        split_dim: The axis split (negative counts from the end).
        contiguous_chunks: Chunk sizes along ``split_dim``, each split
            separately; None means one chunk, the whole axis.
    """

    split_dim: int
    contiguous_chunks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.split_dim, bool) or not isinstance(self.split_dim, int):
            raise TypeError(f"SplitConfig.split_dim must be an int, got {self.split_dim!r}")
        if self.contiguous_chunks is not None:
            chunks = tuple(self.contiguous_chunks)
            if not chunks or any(
                isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in chunks
            ):
                raise ValueError(
                    f"SplitConfig.contiguous_chunks must be positive ints, got {chunks!r}"
                )
            object.__setattr__(self, "contiguous_chunks", chunks)


def _resolve(
    config: SplitConfig, shape: Sequence[int], num_shards: int
) -> tuple[int, tuple[int, ...]]:
    """The non-negative split axis and the chunk sizes, checked against ``shape``."""
    rank = len(shape)
    if not -rank <= config.split_dim < rank:
        raise ValueError(f"split_dim {config.split_dim} is out of range for shape {tuple(shape)}")
    axis = config.split_dim % rank
    size = shape[axis]
    chunks = config.contiguous_chunks or (size,)
    if sum(chunks) != size:
        raise ValueError(
            f"contiguous_chunks {chunks} sum to {sum(chunks)}, but axis {axis} has size {size}"
        )
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got {num_shards}")
    uneven = [c for c in chunks if c % num_shards]
    if uneven:
        raise ValueError(
            f"chunks {uneven} of {chunks} do not divide into {num_shards} shards; "
            "nanotron splits each chunk evenly"
        )
    return axis, chunks


def spec_from_split_config(
    config: SplitConfig, shape: Sequence[int], devices: Sequence[int], tensor_name: str
) -> ShardingSpec:
    """The ONNX spec equivalent to a nanotron split with equal chunks.

    Args:
        config: The split.
        shape: The whole (unsharded) parameter's shape.
        devices: The device of each rank, in rank order.
        tensor_name: The parameter's tensor name.

    Returns:
        A plain split for one chunk; for m equal chunks of c, the fused axis
        ``(m x 1, c x N)``.

    Raises:
        ValueError: Chunks do not fit ``shape`` or do not divide evenly, or the
            chunks are unequal (no ONNX spec expresses that).

    Example:
        >>> spec_from_split_config(SplitConfig(0, (4, 4)), (8, 3), [0, 1], "W")
        ShardingSpec('W', '0:(2x1,4x2) @ [0,1]')
    """
    _, chunks = _resolve(config, shape, len(devices))
    if len(set(chunks)) > 1:
        raise ValueError(
            f"contiguous_chunks {chunks} are unequal: an ONNX fused axis views the axis as a "
            "row-major grid of sub-axes, all of whose rows have one length, so no ShardingSpec "
            "splits unequal chunks separately. Permute the axis with contiguous_permutation() "
            "and use a plain split, or use ChunkedSplit for host-side split/merge"
        )
    if len(chunks) == 1:
        parts: tuple[SimpleShardedDim, ...] = (SimpleShardedDim(len(devices)),)
    else:
        parts = (
            SimpleShardedDim(1, dim_value=len(chunks)),
            SimpleShardedDim(len(devices), dim_value=chunks[0]),
        )
    return ShardingSpec(tensor_name, (ShardedDim(config.split_dim, parts),), tuple(devices))


def contiguous_permutation(
    config: SplitConfig, shape: Sequence[int], num_shards: int
) -> np.ndarray:
    """The reordering of the split axis that makes each rank's part contiguous.

    ``np.take(w, perm, axis=split_dim)`` split plainly in ``num_shards`` gives
    rank p exactly nanotron's part for rank p, in nanotron's local order. The
    permuted axis means something else to the ops that read it: they must be
    permuted alike (e.g. the q/k/v Split after a fused projection becomes a
    per-rank split of sizes ``chunk / num_shards``).

    Args:
        config: The split.
        shape: The whole parameter's shape.
        num_shards: Number of ranks.

    Returns:
        An int64 array ``perm`` of length ``shape[split_dim]``: position i of
        the permuted axis is global position ``perm[i]``.

    Raises:
        ValueError: Chunks do not fit ``shape`` or do not divide evenly.

    Example:
        >>> contiguous_permutation(SplitConfig(0, (4, 2)), (6,), 2).tolist()
        [0, 1, 4, 2, 3, 5]
    """
    _, chunks = _resolve(config, shape, num_shards)
    starts = np.cumsum((0, *chunks[:-1]))
    pieces = [
        np.arange(start + rank * (chunk // num_shards), start + (rank + 1) * (chunk // num_shards))
        for rank in range(num_shards)
        for start, chunk in zip(starts.tolist(), chunks, strict=True)
    ]
    return np.concatenate(pieces).astype(np.int64)


@dataclass(frozen=True, slots=True)
class ChunkedSplit:
    """A nanotron split on a concrete shape: geometry, split and merge.

    Works for unequal chunks too, where no `ShardingSpec` applies.

    Attributes:
        config: The split.
        shape: The whole parameter's shape.
        devices: The device of each rank, in rank order.
    """

    config: SplitConfig
    shape: tuple[int, ...]
    devices: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        object.__setattr__(self, "devices", tuple(self.devices))
        if len(set(self.devices)) != len(self.devices):
            raise ValueError(f"ChunkedSplit.devices must be distinct, got {self.devices}")
        _resolve(self.config, self.shape, len(self.devices))

    def regions(self) -> dict[int, Region]:
        """Each device's region (shard = its rank), like `tiles.device_regions`."""
        axis, chunks = _resolve(self.config, self.shape, len(self.devices))
        starts = np.cumsum((0, *chunks[:-1])).tolist()
        whole = [((0, n),) if n else () for n in self.shape]
        result = {}
        for rank, device in enumerate(self.devices):
            ranges: list[tuple[int, int]] = []
            for start, chunk in zip(starts, chunks, strict=True):
                width = chunk // len(self.devices)
                lo, hi = start + rank * width, start + (rank + 1) * width
                if ranges and ranges[-1][1] == lo:
                    lo = ranges.pop()[0]
                ranges.append((lo, hi))
            axes = list(whole)
            axes[axis] = tuple(ranges)
            result[device] = Region(rank, tuple(axes))
        return result

    def split(self, array: np.ndarray) -> dict[int, np.ndarray]:
        """Each device's local array.

        Raises:
            ValueError: ``array`` does not have ``shape``.
        """
        array = np.asarray(array)
        if array.shape != self.shape:
            raise ValueError(f"array has shape {array.shape}, expected {self.shape}")
        return split_regions(array, self.regions())

    def merge(self, shards: dict[int, np.ndarray]) -> np.ndarray:
        """The whole parameter from the devices' local arrays (see `tiles.merge_regions`)."""
        return merge_regions(shards, self.regions(), self.shape)
