"""Shape ops: shardings move to the axes their data moves to.

- Reshape, Squeeze, Unsqueeze, Flatten, Transpose: a reshape of axis groups
  (`_core.regroup`); splitting or fusing a sharded axis gives a fused-axis
  spec, simplified where it is a plain split.
- Concat: the inputs must agree on the other axes (like elementwise inputs);
  the concatenated axis comes out whole (an all-gather if it was sharded).
- Split: an unsharded split axis leaves every output sharded like the input;
  a fused axis whose outer sub-axis is the split (GPT-2's q/k/v) gives each
  output the inner sub-axes; in a plain split, a piece that holds whole
  shards keeps them when a mesh can express that block (its shard count
  divides the axis's, it starts at a multiple of it); any other piece comes
  out whole on the axis (one all-gather before the cut, with a note).
- Slice: a sharded axis is kept when the slice takes all of it, else gathered.
- Expand: like a broadcast from the input; Tile: repeated axes come out whole.
"""

from __future__ import annotations

import numpy as np

from sharding import codes
from sharding.rules.base import Rule, text
from sharding.rules.contract import Operand, contract, elementwise_labels
from sharding.rules.regroup import regroup, reshape_groups, unshard
from sharding.rules.views import build_spec, device_sets, make_dim, resolved_parts, sharded_dims
from sharding.spec import ShardingSpec


def _shape(ctx, rank, index=0):
    shape = ctx.in_shapes[index] if index < len(ctx.in_shapes) else None
    return shape if shape is not None else (None,) * rank


def _gather_note(ctx, name, axes, spec, why=None):
    """A note that ``name`` comes out whole on ``axes`` of ``spec`` (an all-gather); ``why``: the reason, when it is not
    simply that the op needs the axes whole."""
    reason = f"{ctx.op_type} needs them whole" if why is None else f"{name!r} {why}"
    ctx.diag(
        codes.COLLECTIVE,
        f"axes {axes} of {spec.tensor_name!r} are sharded ({text(spec)}) but {reason}: {name!r} comes out "
        "unsharded there (an all-gather)",
        severity="note",
        tensor=name,
        expected="all-gather",
    )


class Reshape(Rule):
    ops = frozenset({"Reshape"})

    def outputs(self, ctx, in_specs):
        spec, name = in_specs[0], ctx.node.output[0]
        if spec is None:
            return []
        in_shape, out_shape = ctx.in_shapes[0], ctx.out_shapes[0]
        if not sharded_dims(spec, None if in_shape is None else len(in_shape)):
            return [unshard(spec, [], None, name)]
        if in_shape is None or out_shape is None:
            ctx.unknown("the input or output shape is unknown", tensor=spec.tensor_name)
            return []
        return [regroup(ctx, spec, in_shape, out_shape, reshape_groups(in_shape, out_shape), name)]


class AxisMap(Rule):
    """Transpose, Squeeze, Unsqueeze, Flatten: groups known from attributes."""

    ops = frozenset({"Transpose", "Squeeze", "Unsqueeze", "Flatten"})

    def groups(self, ctx, rank):
        op = ctx.op_type
        if op == "Transpose":
            perm = ctx.attr("perm") or list(range(rank))[::-1]
            return [([a], [list(perm).index(a)]) for a in range(rank)]
        if op == "Flatten":
            axis = int(ctx.attr("axis", 1)) % (rank + 1)
            return [(list(range(axis)), [0]), (list(range(axis, rank)), [1])]
        axes = ctx.int_list("axes", 1)
        if op == "Squeeze":
            if axes is None:
                shape = ctx.in_shapes[0]
                if shape is None or any(d is None or isinstance(d, str) for d in shape):
                    return None
                axes = [a for a, d in enumerate(shape) if d == 1]
            axes = {a % rank for a in axes}
            kept = [a for a in range(rank) if a not in axes]
            return [([a], [j]) for j, a in enumerate(kept)] + [([a], []) for a in sorted(axes)]
        if axes is None:
            return None
        out_rank = rank + len(axes)
        new = {a % out_rank for a in axes}
        old = [j for j in range(out_rank) if j not in new]
        return [([a], [j]) for a, j in enumerate(old)] + [([], [j]) for j in sorted(new)]

    def outputs(self, ctx, in_specs):
        spec, name = in_specs[0], ctx.node.output[0]
        if spec is None:
            return []
        rank = ctx.rank(0)
        if rank is None and ctx.op_type == "Transpose" and ctx.attr("perm"):
            rank = len(ctx.attr("perm"))
        if rank is None:
            if not sharded_dims(spec, None):
                return [unshard(spec, [], None, name)]
            ctx.unknown_rank(0)
            return []
        groups = self.groups(ctx, rank)
        if groups is None:
            if not sharded_dims(spec, rank):
                return [unshard(spec, [], rank, name)]
            ctx.unknown("the axes are not constants", tensor=ctx.node.input[0])
            return []
        out_shape = ctx.out_shapes[0] if ctx.out_shapes[0] is not None else None
        return [regroup(ctx, spec, _shape(ctx, rank), out_shape, groups, name)]


class Concat(Rule):
    ops = frozenset({"Concat"})

    def outputs(self, ctx, in_specs):
        rank = ctx.out_rank(0)
        if rank is None:
            rank = next((len(s) for s in ctx.in_shapes if s is not None), None)
        if rank is None:
            ctx.unknown("the ranks of the inputs are unknown")
            return []
        axis = int(ctx.attr("axis", 0)) % max(rank, 1)
        operands = []
        for i, spec in enumerate(in_specs):
            if ctx.input_name(i):
                labels = [("cat", i) if a == axis else a for a in range(rank)]
                operands.append(Operand(spec, labels, ctx.in_shapes[i]))
        out = [None if a == axis else a for a in range(rank)]
        return contract(ctx, operands, [(ctx.node.output[0], out)], reduce_kind="all-gather")


class Split(Rule):
    ops = frozenset({"Split"})

    def outputs(self, ctx, in_specs):
        spec = in_specs[0]
        names = list(ctx.node.output)
        if spec is None:
            return []
        rank = ctx.rank(0)
        cut = dict(sharded_dims(spec, rank)) if rank is not None else {}
        if rank is None and sharded_dims(spec, None):
            ctx.unknown_rank(0)
            return []
        axis = int(ctx.attr("axis", 0)) % rank if rank else 0
        if axis not in cut:
            return [unshard(spec, [], rank, n) for n in names]
        size = ctx.in_shapes[0][axis]
        sizes = ctx.int_list("split", 1)
        if sizes is None and isinstance(size, int):
            block = -(-size // len(names))
            sizes = [min(block, size - i * block) for i in range(len(names))]
        pieces = _split_sharded(spec, cut, axis, rank, size, sizes, names) if sizes else None
        if pieces is None:
            _gather_note(ctx, names[0], [axis], spec)
            return [unshard(spec, [axis], rank, n) for n in names]
        results = []
        for name, piece in zip(names, pieces, strict=True):
            if isinstance(piece, str):
                _gather_note(ctx, name, [axis], spec, piece)
                piece = unshard(spec, [axis], rank, name)
            results.append(piece)
        return results


def _radix(spec):
    """Shard numbers as an array with one axis per part of every dim (listing order)."""
    counts = [p.num_shards for d in spec.sharded_dims for p in d.parts]
    return np.arange(spec.num_shards).reshape(counts or [1])


def _part_position(spec, axis, rank, j):
    pos = 0
    for d in spec.sharded_dims:
        if d.axis % rank == axis:
            return pos + j
        pos += len(d.parts)
    raise KeyError(axis)


def _split_sharded(spec, cut, axis, rank, size, sizes, names):
    """Per output, its spec when the split axis is sharded, or why that piece comes out whole (a str).

    None in place of the list when no piece can keep its shards (the pieces
    straddle shards, or the axis is not a plain split of a known size).
    """
    dim = cut[axis]
    parts = resolved_parts(dim, size)
    sets = device_sets(spec)
    grid = _radix(spec)
    position = _part_position(spec, axis, rank, 0)
    index = next(i for i, d in enumerate(spec.sharded_dims) if d.axis % rank == axis)
    others = [d for i, d in enumerate(spec.sharded_dims) if i != index]
    results = []
    s0, n0 = parts[0]
    if len(parts) > 1 and s0 == len(names) and len(set(sizes)) == 1 and s0 and s0 % n0 == 0:
        # Fused axis whose outer sub-axis is the split: each output takes the inner sub-axes.
        inner = make_dim(axis, parts[1:])
        for i, name in enumerate(names):
            picked = np.take(grid, i // (s0 // n0), axis=position)
            dims = list(others)
            if inner is not None:
                dims.insert(index, inner)
            results.append(build_spec(name, dims, [sets[k] for k in picked.ravel()]))
        return results
    if len(parts) > 1 or not isinstance(size, int) or size % n0:
        return None
    block = size // n0
    kept = _expressible_pieces(n0, [(start // block, piece // block) for start, piece in _aligned(sizes, block)])
    if not kept:
        return None
    start = 0
    for piece, name in zip(sizes, names, strict=False):
        first, count = start // block, piece // block
        start += piece
        if (first, count) not in kept:
            aligned = count and not piece % block and not (start - piece) % block
            results.append(
                f"would hold {count} of the {n0} shards of axis {axis}, a block no mesh of the devices can hold"
                if aligned else f"does not begin and end on shard boundaries (every {block} of axis {axis})"
            )
            continue
        picked = np.take(grid, range(first, first + count), axis=position)
        dims = list(others)
        if count > 1:
            dims.insert(index, make_dim(axis, [(None, count)]))
        results.append(build_spec(name, dims, [sets[k] for k in picked.ravel()]))
    return results


def _aligned(sizes, block):
    """The (start, size) of each piece that begins and ends on a shard boundary."""
    start, found = 0, []
    for piece in sizes:
        if piece and not piece % block and not start % block:
            found.append((start, piece))
        start += piece
    return found


def _expressible_pieces(num_shards, pieces):
    """The pieces (first shard, shard count) that can keep their shards on one mesh.

    A piece keeps a block of ``count`` of the axis's ``num_shards`` shards. On a
    mesh, shard i of the axis sits at the mixed-radix digits of i over the mesh
    axes that split it, so a block is a sub-mesh only when ``count`` divides
    ``num_shards`` and the block starts at a multiple of ``count``; and blocks
    of several sizes fit one radix only when each size divides the next. 8
    shards split [3, 5]: neither 3 nor 5 divides 8, both pieces come out whole.
    8 shards split [2, 6]: the first keeps shards 0-1, the second is whole.
    Larger counts are kept first; a smaller count that does not divide them is
    dropped.
    """
    fits = [(first, count) for first, count in pieces if num_shards % count == 0 and first % count == 0]
    chain: list[int] = []
    for count in sorted({c for _, c in fits}, reverse=True):
        if all(c % count == 0 for c in chain):
            chain.append(count)
    return {(first, count) for first, count in fits if count in chain}


class Slice(Rule):
    ops = frozenset({"Slice"})

    def outputs(self, ctx, in_specs):
        spec, name = in_specs[0], ctx.node.output[0]
        if spec is None:
            return []
        rank = ctx.rank(0)
        if not sharded_dims(spec, rank):
            return [unshard(spec, [], rank, name)]
        if rank is None:
            ctx.unknown_rank(0)
            return []
        if "starts" in ctx.attrs:
            starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
        else:
            starts, ends = ctx.int_list("", 1), ctx.int_list("", 2)
            axes, steps = ctx.int_list("", 3), ctx.int_list("", 4)
            if ctx.input_name(3) and axes is None:
                starts = None
        cut = dict(sharded_dims(spec, rank))
        if starts is None or ends is None:
            ctx.unknown("the slice bounds are not constants", tensor=spec.tensor_name)
            return []
        axes = [a % rank for a in axes] if axes else list(range(len(starts)))
        steps = steps or [1] * len(starts)
        shape = ctx.in_shapes[0]
        sliced, outer = [], {}
        for a, start, end, step in zip(axes, starts, ends, steps, strict=False):
            if a not in cut:
                continue
            size = shape[a] if shape is not None else None
            known = isinstance(size, int)
            from_start = start == 0 or start <= -(2**62) or (known and start <= -size)
            to_end = end >= 2**31 - 1 or (known and end >= size)
            if step == 1 and from_start and to_end:
                continue
            pieces = _outer_pieces(cut[a], size, start, end) if step == 1 else None
            if pieces is None:
                sliced.append(a)
            else:
                outer[a] = pieces
        if sliced:
            _gather_note(ctx, name, sliced, spec)
        out = unshard(spec, sliced, rank, name)
        if outer:
            dims = []
            for d in out.sharded_dims:
                a = d.axis % rank
                if a in outer:
                    parts = resolved_parts(d, shape[a])
                    d = make_dim(d.axis, [(outer[a], 1)] + parts[1:])
                dims.append(d)
            out = ShardingSpec(name, tuple(dims), out.devices, out.groups)
        return [out]


def _outer_pieces(dim, size, start, end):
    """A slice of a fused axis at boundaries of its unsharded outer sub-axis: the outer size it keeps.

    ``[3*HD]`` as (3, 1 shard) x (HD, 8 shards) sliced at [HD, 2*HD) keeps one
    step of the outer sub-axis, every device its own block of it: no data
    moves. None for any other slice.
    """
    if not isinstance(size, int) or len(dim.parts) < 2:
        return None
    parts = resolved_parts(dim, size)
    if parts[0][1] != 1 or any(not isinstance(s, int) for s, _ in parts):
        return None
    inner = size // parts[0][0]
    start = max(0, start + size if start < 0 else start)
    end = min(size, end + size if end < 0 else end)
    if end <= start or start % inner or end % inner:
        return None
    return (end - start) // inner


class Expand(Rule):
    ops = frozenset({"Expand"})

    def outputs(self, ctx, in_specs):
        spec, name = in_specs[0], ctx.node.output[0]
        if spec is None:
            return []
        out_shape = ctx.out_shapes[0]
        target = ctx.constant(1)
        out_rank = len(out_shape) if out_shape is not None else None
        if out_rank is None and target is not None and ctx.in_shapes[0] is not None:
            out_rank = max(len(ctx.in_shapes[0]), int(np.asarray(target).size))
        labels = elementwise_labels(ctx.in_shapes[0], out_rank, out_shape) if out_rank is not None else None
        if labels is None:
            if not sharded_dims(spec, None):
                return [unshard(spec, [], None, name)]
            ctx.unknown("the input or output shape is unknown", tensor=spec.tensor_name)
            return []
        return contract(ctx, [Operand(spec, labels, ctx.in_shapes[0])], [(name, list(range(out_rank)))])


class Tile(Rule):
    ops = frozenset({"Tile"})

    def outputs(self, ctx, in_specs):
        spec, name = in_specs[0], ctx.node.output[0]
        if spec is None:
            return []
        repeats = ctx.int_list("", 1)
        rank = ctx.rank(0) or (len(repeats) if repeats is not None else None)
        if repeats is None or rank is None:
            if not sharded_dims(spec, rank):
                return [unshard(spec, [], rank, name)]
            ctx.unknown("the repeats are not a constant", tensor=spec.tensor_name)
            return []
        labels = [a if r == 1 else ("tile", a) for a, r in enumerate(repeats)]
        out = [a if r == 1 else None for a, r in enumerate(repeats)]
        return contract(ctx, [Operand(spec, labels, ctx.in_shapes[0])], [(name, out)], reduce_kind="all-gather")


RULES = [Reshape(), AxisMap(), Concat(), Split(), Slice(), Expand(), Tile()]
