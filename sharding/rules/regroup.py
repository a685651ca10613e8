"""The `regroup` engine: a rule describes its op as a reshape of axis groups.

The op as a reshape of axis groups (Reshape, Squeeze, Flatten,
Transpose...): each group of input axes becomes a group of output axes of the
same element count, and a sharded axis that is split or fused becomes a
fused-axis spec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sharding import codes
from sharding.rules.base import NodeContext, Shape
from sharding.rules.views import build_spec, device_sets, make_dim, resolved_parts, sharded_dims
from sharding.spec import ShardingSpec


def unshard(spec: ShardingSpec, axes: Sequence[int], rank: int | None, name: str) -> ShardingSpec:
    """``spec`` with ``axes`` gathered: each remaining shard on the union of the devices it spans."""
    keep = []
    for dim in spec.sharded_dims:
        axis = dim.axis % rank if rank else dim.axis
        keep.append(axis not in axes and dim.num_shards > 1)
    sets = device_sets(spec)
    counts = [d.num_shards for d in spec.sharded_dims]
    grid = np.arange(spec.num_shards).reshape(counts or [1])
    drop = tuple(i for i, k in enumerate(keep) if not k)
    kept_dims = [d for d, k in zip(spec.sharded_dims, keep, strict=True) if k]
    moved = (
        np.moveaxis(grid, drop, tuple(range(grid.ndim - len(drop), grid.ndim))) if drop else grid
    )
    flat = moved.reshape(-1, math.prod(counts[i] for i in drop) if drop else 1)
    blocks = [frozenset().union(*(sets[s] for s in row)) for row in flat.tolist()]
    return build_spec(name, kept_dims, blocks)


def reorder(devices: Sequence[int], counts: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    """Device entries renumbered when the shard axes (mixed radix ``counts``) are permuted."""
    if list(perm) == sorted(perm):
        return tuple(devices)
    grid = np.asarray(devices, dtype=np.int64).reshape(list(counts) or [1])
    return tuple(int(d) for d in np.transpose(grid, perm).ravel())


def regroup(
    ctx: NodeContext,
    spec: ShardingSpec,
    in_shape: Shape | None,
    out_shape: Shape | None,
    groups: Sequence[tuple[Sequence[int], Sequence[int]]],
    name: str,
) -> ShardingSpec | None:
    """The spec of a reshape whose axis groups are ``groups`` (input axes, output axes).

    A sharded axis in a 1:1 group moves to its output axis. In a larger group
    the axes are viewed as one row-major run of sub-axes (a sharded axis
    contributes its parts), cut again at the output axes' sizes; output axes
    that receive several sub-axes get fused-axis specs, simplified when they
    are plain splits (GQA's ``[4 in 4, 2 in 1]`` over 8 is 4 shards). Shard
    numbering follows the input's listing order, so devices are permuted
    where the output lists its dims in another order.

    Worked example: ``[B, S, 64] -> [B, S, 8, 8]`` with axis 2 in 8 shards:
    the group ``([2], [2, 3])`` cuts the sub-axis (64, 8 shards) at 8 into
    (8, 8 shards) x (8, 1 shard): the heads axis 2 is cut in 8.
    """
    rank = len(in_shape) if in_shape is not None else None
    cut = dict(sharded_dims(spec, rank))
    if not cut:
        return unshard(spec, [], rank, name)
    group_of = {axis: g for g, (ins, _) in enumerate(groups) for axis in ins}
    # Each sharded part of the input is an atom (axis, part); splitting gives pieces.
    atoms = [
        (axis, j) for axis, dim in cut.items() for j, p in enumerate(dim.parts) if p.num_shards > 1
    ]
    out_parts: dict[int, list[tuple[int | None, int, tuple | None]]] = {}
    gathered = []
    for axis, dim in cut.items():
        ins, outs = groups[group_of[axis]] if axis in group_of else ((), ())
        if not outs:
            gathered.append(axis)
        elif len(ins) == 1 and len(outs) == 1:
            size = in_shape[axis] if in_shape is not None else None
            out_parts[outs[0]] = [
                (s, n, (axis, j, 0) if n > 1 else None)
                for j, (s, n) in enumerate(resolved_parts(dim, size))
            ]
        elif outs[0] not in out_parts:
            sizes_in = [in_shape[a] if in_shape is not None else None for a in ins]
            sizes_out = [out_shape[a] if out_shape is not None else None for a in outs]
            symbolic = any(not isinstance(s, int) for s in sizes_in + sizes_out)
            split = _symbolic_group(ins, outs, sizes_in, sizes_out, cut) if symbolic else None
            if split is not None:
                out_parts.update(split)
                continue
            if symbolic:
                ctx.unknown(
                    f"axis {axis} of {spec.tensor_name!r} is sharded and reshaped together with "
                    f"axes of unknown size ({sizes_in} -> {sizes_out})",
                    tensor=spec.tensor_name,
                )
                return None
            split = _split_group(ins, outs, sizes_in, sizes_out, cut)
            if split is None:
                ctx.diag(
                    codes.RESHAPE_UNSUPPORTED,
                    f"axis {axis} of {spec.tensor_name!r} (parts {resolved_parts(dim, sizes_in[ins.index(axis)])} "
                    f"as (size, shards)) cannot follow the reshape {sizes_in} -> {sizes_out}: "
                    "a shard boundary falls inside an output axis's block; it is gathered",
                    "shard an axis that the reshape keeps whole, or reshard before it",
                    severity="warning",
                    tensor=spec.tensor_name,
                    axis=axis,
                    expected="all-gather",
                )
                gathered += [a for a in ins if a in cut]
            else:
                out_parts.update(split)
    if gathered:
        return regroup(
            ctx, unshard(spec, gathered, rank, spec.tensor_name), in_shape, out_shape, groups, name
        )
    count = {piece: n for parts in out_parts.values() for _, n, piece in parts if piece is not None}
    in_order = sorted(count, key=lambda piece: (atoms.index(piece[:2]), piece[2]))

    def first(axis: int) -> int:
        found = [in_order.index(p) for _, _, p in out_parts[axis] if p is not None]
        return min(found, default=len(in_order))

    dims, out_order = [], []
    for axis in sorted(out_parts, key=first):
        dim = make_dim(axis, [(s, n) for s, n, _ in out_parts[axis]])
        if dim is not None:
            dims.append(dim)
            out_order += [p for _, _, p in out_parts[axis] if p is not None]
    counts = [count[p] for p in in_order]
    devices = reorder(spec.devices, counts, [in_order.index(p) for p in out_order])
    return ShardingSpec(name, tuple(dims), devices, spec.groups)


def _symbolic_group(ins, outs, sizes_in, sizes_out, cut):
    """A group with symbolic sizes whose sharded sub-axes are static: pure fusion or pure unfusion.

    ``[B, H] -> [B*H]`` with H sharded fuses into parts ``(?, 1), (H, n)``;
    ``[B*H] -> [B, H]`` undoes it, each part landing on one output axis. At
    most one part may be of unknown size (a fused axis infers one from its
    size). None when the group is anything else.
    """
    atoms = []  # (size or None, shards, piece)
    for axis, size in zip(ins, sizes_in, strict=True):
        if axis in cut:
            for j, (s, n) in enumerate(resolved_parts(cut[axis], size)):
                if n > 1 and not isinstance(s, int):
                    return None
                atoms.append((s, n, (axis, j, 0) if n > 1 else None))
        elif size != 1:
            atoms.append((size if isinstance(size, int) else None, 1, None))
    if len(outs) == 1:
        merged: list = []
        for size, n, piece in atoms:
            if merged and n == 1 and merged[-1][1] == 1:
                prev = merged[-1][0]
                merged[-1] = (prev * size if prev is not None and size is not None else None, 1, None)
            else:
                merged.append((size, n, piece))
        if sum(size is None for size, _, _ in merged) > 1:
            return None
        return {outs[0]: merged}
    if len(ins) != 1:
        return None
    wanted = [(a, s) for a, s in zip(outs, sizes_out, strict=True) if s != 1]
    if len(wanted) != len(atoms):
        return None
    result = {a: [] for a in outs}
    for (axis, want), (size, n, piece) in zip(wanted, atoms, strict=True):
        if isinstance(want, int) and size is not None and size != want:
            return None
        if n > 1 and not isinstance(want, int):
            return None
        result[axis] = [(want if isinstance(want, int) else None, n, piece)]
    return result


def _split_group(ins, outs, sizes_in, sizes_out, cut):
    """Cuts one group's sub-axes at the output sizes; None when a block would straddle."""
    if 0 in sizes_in or 0 in sizes_out:
        return None
    atoms: list[list] = []  # [size, shards, atom id, piece]
    for axis, size in zip(ins, sizes_in, strict=True):
        if axis in cut:
            for j, (s, n) in enumerate(resolved_parts(cut[axis], size)):
                if s is None or s % n:
                    return None
                atoms.append([s, n, (axis, j) if n > 1 else None, 0])
        elif size != 1:
            atoms.append([size, 1, None, 0])
    # An unsharded run only lengthens the blocks before it: (2 in 2) (3) (4)
    # is (24 in 2), which [4, 2, 3] can cut at 4 even though 3 does not split.
    merged: list[list] = []
    for atom in atoms:
        if merged and atom[1] == 1 and merged[-1][0] % merged[-1][1] == 0:
            merged[-1][0] *= atom[0]
        else:
            merged.append(atom)
    atoms = merged
    result: dict[int, list] = {}
    k = 0
    for out_axis, want in zip(outs, sizes_out, strict=True):
        parts = []
        have = 1
        while have < want:
            if k >= len(atoms):
                return None
            s, n, a, piece = atoms[k]
            if have * s <= want:
                if want % (have * s):
                    return None
                parts.append((s, n, None if a is None else (*a, piece)))
                have *= s
                k += 1
                continue
            # Split this atom: the outer piece fills the axis, the inner stays.
            outer = want // have
            if s % outer:
                return None
            inner = s // outer
            block = s // n
            if block % inner == 0:  # blocks hold whole inner runs
                n_outer, n_inner = n, 1
            elif inner % block == 0:  # the inner run holds whole blocks
                n_inner = inner // block
                n_outer = n // n_inner
                if n_outer * n_inner != n or outer % n_outer:
                    return None
            else:
                return None
            parts.append((outer, n_outer, None if a is None or n_outer == 1 else (*a, piece)))
            atoms[k] = [inner, n_inner, a if n_inner > 1 else None, piece + 1]
            have *= outer
        result[out_axis] = parts
    return result


def reshape_groups(in_shape: Shape, out_shape: Shape) -> list[tuple[list[int], list[int]]]:
    """Axis groups of a row-major reshape ``in_shape -> out_shape``.

    Groups are found from both ends: an identical dim (same int or same
    symbol) maps 1:1, and runs of int dims with equal products form a group
    (``[B, S, 8, 8] -> [B*S, 64]`` ends with ``([2, 3], [1])``). What is left
    in the middle, where symbols differ, is one group.
    """
    front, i, j = _groups_from(list(in_shape), list(out_shape))
    rest_in, rest_out = list(in_shape[i:]), list(out_shape[j:])
    back, bi, bj = _groups_from(rest_in[::-1], rest_out[::-1])
    n_in, n_out = len(in_shape), len(out_shape)
    back = [
        (sorted(n_in - 1 - a for a in gi), sorted(n_out - 1 - b for b in go)) for gi, go in back
    ][::-1]
    middle_in = list(range(i, n_in - bi))
    middle_out = list(range(j, n_out - bj))
    middle = [(middle_in, middle_out)] if middle_in or middle_out else []
    return front + middle + back


def _groups_from(a: list, b: list) -> tuple[list[tuple[list[int], list[int]]], int, int]:
    """Groups from the front of ``a`` and ``b`` until a symbol stops them."""
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] is not None and a[i] == b[j]:
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
            continue
        gi, go, pi, po = [], [], 1, 1
        while not (gi and go and pi == po):
            if pi <= po and i + len(gi) < len(a) and isinstance(a[i + len(gi)], int):
                pi *= a[i + len(gi)]
                gi.append(i + len(gi))
            elif j + len(go) < len(b) and isinstance(b[j + len(go)], int) and (po < pi or not go):
                po *= b[j + len(go)]
                go.append(j + len(go))
            else:
                return groups, i, j
        groups.append((gi, go))
        i, j = i + len(gi), j + len(go)
    return groups, i, j
