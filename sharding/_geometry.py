"""Index arithmetic shared by canonical forms, tiles and pictures.

A spec numbers its shards row-major over its `sharded_dims` in the order
written, and within a fused axis over its sub-axes (DESIGN, "What a sharding
spec means"). Every axis contributes an independent *block index* and the
shard number is their weighted sum, so the whole geometry reduces to one
`AxisLayout` per tensor axis.

Worked example: shape (4, 8), spec ``1:(2x1,4x2),0:2`` (axis 1 fused as
sub-axes [2, 4] with 1 and 2 shards, then axis 0 in 2 shards).

- Axis 1 (listed first): shards = 1 * 2 = 2, stride = 2 (the shard count of
  every dim listed after it: axis 0's 2). Position i has sub-coordinates
  (i // 4, i % 4); sub-axis 1 has blocks of ceil(4 / 2) = 2, so
  blocks = [0, 0, 1, 1, 0, 0, 1, 1] and runs = (0,2,0) (2,4,1) (4,6,0) (6,8,1).
- Axis 0: shards = 2, stride = 1, blocks = [0, 0, 1, 1].
- Element (3, 5): block 1 on axis 0 and block 0 on axis 1, so it is in shard
  1 * 1 + 0 * 2 = 1. Shard 1 holds rows [2, 4) and columns [0, 2) + [4, 6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sharding.spec import ShardingSpec


@dataclass(frozen=True)
class AxisLayout:
    """How one tensor axis is cut into blocks.

    Attributes:
        size: The axis size.
        shards: Number of blocks along the axis (1 when not sharded).
        stride: Weight of this axis's block index in the shard number.
        blocks: ``blocks[i]`` is the block holding position ``i``.
        runs: Maximal ``(start, stop, block)`` runs of equal block, in order;
            empty blocks (uneven sizes) have no run.
    """

    size: int
    shards: int
    stride: int
    blocks: np.ndarray
    runs: tuple[tuple[int, int, int], ...]

    def block_of_shard(self, shard: int) -> int:
        """The block along this axis that shard number ``shard`` covers."""
        return (shard // self.stride) % self.shards

    def ranges(self, block: int) -> tuple[tuple[int, int], ...]:
        """The global ``[start, stop)`` ranges that ``block`` covers, in order."""
        return tuple((start, stop) for start, stop, b in self.runs if b == block)


def block_size(size: int, num_shards: int) -> int:
    """Block length of an axis of ``size`` cut in ``num_shards`` (GSPMD: ceil)."""
    return -(-size // num_shards)


def axis_blocks(sizes: tuple[int, ...], num_shards: tuple[int, ...]) -> np.ndarray:
    """Block index of every position of an axis viewed as sub-axes ``sizes``.

    Args:
        sizes: Sub-axis sizes, outermost first; their product is the axis size.
        num_shards: Shards per sub-axis.

    Returns:
        An int64 array with the axis-local block index (row-major over the
        sub-axes' blocks) of each position.
    """
    n = math.prod(sizes)
    block = np.zeros(n, dtype=np.int64)
    if n == 0:
        return block
    coords = np.unravel_index(np.arange(n), sizes)
    for coord, size, shards in zip(coords, sizes, num_shards, strict=True):
        block = block * shards + coord // block_size(size, shards)
    return block


def _runs(blocks: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    if blocks.size == 0:
        return ()
    cuts = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1
    starts = np.concatenate(([0], cuts))
    stops = np.concatenate((cuts, [blocks.size]))
    return tuple(zip(starts.tolist(), stops.tolist(), blocks[starts].tolist(), strict=True))


def check_shape(shape: tuple[int, ...], what: str) -> tuple[int, ...]:
    """Returns ``shape`` as a tuple of ints >= 0, or raises ValueError."""
    try:
        dims = tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: shape must hold concrete ints, got {shape!r}") from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{what}: shape must not hold negative sizes, got {shape!r}")
    return dims


def axis_layouts(spec: ShardingSpec, shape: tuple[int, ...]) -> tuple[AxisLayout, ...]:
    """One layout per axis of a tensor of ``shape`` sharded by ``spec``.

    Raises:
        ValueError: An axis is out of range or named twice, or a sub-axis size
            disagrees with ``shape``.
    """
    what = f"tensor {spec.tensor_name!r}"
    shape = check_shape(shape, what)
    rank = len(shape)
    stride = spec.num_shards
    by_axis: dict[int, AxisLayout] = {}
    for dim in spec.sharded_dims:
        if not -rank <= dim.axis < rank:
            raise ValueError(f"{what}: axis {dim.axis} is out of range for rank {rank}")
        axis = dim.axis % rank
        if axis in by_axis:
            raise ValueError(f"{what}: axis {axis} is sharded twice (as {dim.axis} and before)")
        sizes = dim.part_sizes(shape[axis])
        shards = tuple(p.num_shards for p in dim.parts)
        stride //= dim.num_shards
        blocks = axis_blocks(sizes, shards)
        by_axis[axis] = AxisLayout(shape[axis], dim.num_shards, stride, blocks, _runs(blocks))
    layouts = []
    for axis, size in enumerate(shape):
        if axis in by_axis:
            layouts.append(by_axis[axis])
        else:
            blocks = np.zeros(size, dtype=np.int64)
            layouts.append(AxisLayout(size, 1, 1, blocks, _runs(blocks)))
    return tuple(layouts)


def run_grid(layouts: tuple[AxisLayout, ...]) -> np.ndarray:
    """Shard number of every cell of the grid of runs (one grid axis per tensor axis)."""
    grid = np.zeros((), dtype=np.int64)
    for layout in layouts:
        column = np.array([b for _, _, b in layout.runs], dtype=np.int64) * layout.stride
        grid = np.add.outer(grid, column)
    return grid
