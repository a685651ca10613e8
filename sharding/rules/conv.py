"""Convolutions, pooling and the per-channel normalisations of CNNs.

Layout ``X[N, C, *spatial]`` (ONNX's NCHW). What each axis may carry:

* **Batch** N is free: it passes to the output.
* **Channels.** A convolution ``W[M, C/group, *kernel]`` maps input channels
  to output channels M. With ``group == 1`` the input channels are a
  reduction (label K, shared by X's axis 1 and W's axis 1: a split makes the
  partial products meet in an all-reduce, Megatron's row-parallel conv) and
  the output channels follow W's axis 0 (column-parallel). With ``group > 1``
  channel ``c`` only meets the output channels of its own group, so a split
  of the channels into ``w`` blocks with ``group % w == 0`` keeps whole
  groups on each device: X's channels, W's output channels and Y's channels
  share one label and the conv stays local (grouped and depthwise convs keep
  the split). A channel split that cuts a group is refused by name.
  ConvTranspose is the mirror image (``W[C, M/group, *kernel]``).
* **Spatial** axes of a windowed op need *halos* (rows of the neighbouring
  shards). onnx2jax does not run spatial partitioning, so a sharded spatial
  axis of Conv, ConvTranspose, MaxPool, AveragePool, LpPool or Resize is an
  error naming the tensor and axis, never a silent gather. Global pools
  reduce their spatial axes (a sharded one meets in an all-reduce, like a
  ReduceMean).
* BatchNormalization (inference mode) and InstanceNormalization are
  per-channel: their 1-D parameters follow the channel axis. Instance norm
  normalises over the spatial axes (a sharded one comes out whole, like a
  LayerNorm over a sharded axis); BatchNormalization in training mode also
  reduces over the batch.
* Resize keeps every axis whose scale is 1 (batch, channels) and refuses a
  sharded axis it resizes.
"""

from __future__ import annotations

from sharding import codes
from sharding.rules.base import Rule, text
from sharding.rules.contract import Operand, contract
from sharding.rules.views import sharded_dims

CONV = frozenset({"Conv", "ConvInteger", "QLinearConv"})
WINDOWED_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
GLOBAL_POOLS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
NAMES = {"n": "batch N", "k": "input channels", "m": "output channels", "g": "channel groups"}


def _refuse_spatial(ctx, index: int, spec, rank: int, first: int = 2, why: str = "") -> bool:
    """Reports every sharded axis from ``first`` on of input ``index``; True when there was one."""
    found = False
    for axis, dim in sharded_dims(spec, rank) if spec is not None else ():
        if axis < first:
            continue
        found = True
        name = ctx.input_name(index)
        ctx.diag(
            codes.SPATIAL_AXIS_SHARDED,
            f"axis {axis} of {name!r} is cut in {dim.num_shards}, but {ctx.op_type} "
            f"{why or 'slides a window along it and would need halos from neighbouring shards'}; "
            "onnx2jax does not partition spatial axes",
            f"shard {name!r} on the batch or channel axis instead, or replicate axis {axis}",
            tensor=name,
            axis=axis,
            given=text(spec),
            expected=f"axis {axis} unsharded",
        )
    return found


def _channel_cut(spec, rank: int, axis: int) -> int:
    for a, dim in sharded_dims(spec, rank) if spec is not None else ():
        if a == axis:
            return dim.num_shards
    return 1


class Conv(Rule):
    """Conv, ConvInteger, QLinearConv and ConvTranspose."""

    ops = CONV | {"ConvTranspose"}

    def outputs(self, ctx, in_specs):
        ix, iw, ib = (0, 3, 8) if ctx.op_type == "QLinearConv" else (0, 1, 2)
        sx, sw = ctx.in_shapes[ix], ctx.in_shapes[iw]
        rank = len(sx) if sx is not None else (len(sw) if sw is not None else ctx.out_rank(0))
        if rank is None:
            ctx.unknown("the ranks of the input and weight are unknown")
            return []
        x, w = in_specs[ix], in_specs[iw]
        bad = _refuse_spatial(ctx, ix, x, rank)
        bad |= _refuse_spatial(ctx, iw, w, rank, why="slides this kernel axis")
        if bad:
            return []
        group = int(ctx.attr("group", 1))
        transpose = ctx.op_type == "ConvTranspose"
        out_axis, in_axis = (1, 0) if transpose else (0, 1)  # of W: output / input channels
        spatial = [None] * (rank - 2)
        if group == 1:
            lx, lw, ly = ["n", "k", *spatial], [None] * rank, ["n", "m", *spatial]
            lw[in_axis], lw[out_axis] = "k", "m"
        else:
            cuts = {
                ctx.input_name(ix): _channel_cut(x, rank, 1),
                ctx.input_name(iw): _channel_cut(w, rank, 0),
            }
            for name, ways in cuts.items():
                if group % ways:
                    ctx.diag(
                        codes.GROUP_SPLIT,
                        f"the channels of {name!r} are cut in {ways}, which does not divide "
                        f"group={group}: a device would hold part of a channel group",
                        f"cut the channels in a divisor of {group}",
                        tensor=name,
                        axis=1 if name == ctx.input_name(ix) else 0,
                    )
                    return []
            if _channel_cut(w, rank, 1) > 1:
                ctx.diag(
                    codes.GROUP_SPLIT,
                    f"axis 1 of the weight {ctx.input_name(iw)!r} (channels within a group) is cut; "
                    "only whole groups can be split",
                    "cut axis 0 (whole groups) instead",
                    tensor=ctx.input_name(iw),
                    axis=1,
                )
                return []
            # Whole groups: X's channels, W's axis 0 and Y's channels are one axis of groups.
            lx, lw, ly = ["n", "g", *spatial], ["g", None, *spatial], ["n", "g", *spatial]
            lw[1] = "w1"
        operands = [Operand(x, lx, sx), Operand(w, lw, sw)]
        if ib < len(in_specs) and ctx.input_name(ib):
            operands.append(Operand(in_specs[ib], [ly[1]], ctx.in_shapes[ib]))
        if ctx.op_type == "ConvInteger" and len(in_specs) > 3 and ctx.input_name(3):
            shape = ctx.in_shapes[3]
            if shape is not None and len(shape) == 1 and shape[0] != 1:
                operands.append(Operand(in_specs[3], [ly[1]], shape))
        return contract(ctx, operands, [(ctx.node.output[0], ly)], label_names=NAMES)


class WindowedPool(Rule):
    """MaxPool, AveragePool, LpPool: batch and channels free, spatial refused."""

    ops = WINDOWED_POOLS

    def outputs(self, ctx, in_specs):
        rank = ctx.data_rank()
        if rank is None:
            return []
        if _refuse_spatial(ctx, 0, in_specs[0], rank):
            return []
        labels = [0, 1] + [None] * (rank - 2)
        outs = [(name, labels) for name in ctx.node.output if name]  # MaxPool's Indices too
        return contract(ctx, [Operand(in_specs[0], labels, ctx.in_shapes[0])], outs)


class GlobalPool(Rule):
    """Global pools: a reduction over the spatial axes (kept with size 1)."""

    ops = GLOBAL_POOLS

    def outputs(self, ctx, in_specs):
        rank = ctx.data_rank()
        if rank is None:
            return []
        labels = list(range(rank))
        return contract(
            ctx, [Operand(in_specs[0], labels, ctx.in_shapes[0])],
            [(ctx.node.output[0], [0, 1] + [None] * (rank - 2))],
        )


class ChannelNorm(Rule):
    """BatchNormalization and InstanceNormalization: per-channel parameters."""

    ops = frozenset({"BatchNormalization", "InstanceNormalization"})

    def outputs(self, ctx, in_specs):
        rank = ctx.data_rank()
        if rank is None:
            return []
        labels = list(range(rank))
        operands = [Operand(in_specs[0], labels, ctx.in_shapes[0])]
        for i in range(1, len(in_specs)):
            if ctx.input_name(i):
                operands.append(Operand(in_specs[i], [1], ctx.in_shapes[i]))
        if ctx.op_type == "InstanceNormalization":
            kept = [0, 1] + [None] * (rank - 2)  # normalised over the spatial axes
            return contract(ctx, operands, [(ctx.node.output[0], kept)], reduce_kind="all-gather")
        training = int(ctx.attr("training_mode", 0))
        kept = labels if not training else [None, 1] + [None] * (rank - 2)
        outs = [(ctx.node.output[0], kept)]
        outs += [(name, [1]) for name in ctx.node.output[1:] if name]  # running mean / var
        return contract(ctx, operands, outs, reduce_kind="all-gather")


class Resize(Rule):
    """Resize: axes with scale 1 keep their sharding; a resized sharded axis is refused."""

    ops = frozenset({"Resize", "Upsample"})

    def outputs(self, ctx, in_specs):
        rank = ctx.data_rank()
        spec = in_specs[0]
        if rank is None:
            return []
        sx, sy = ctx.in_shapes[0], ctx.out_shapes[0] if ctx.out_shapes else None
        labels = []
        for axis in range(rank):
            same = (sx is not None and sy is not None and isinstance(sx[axis], int)
                    and sx[axis] == sy[axis])
            labels.append(axis if same or axis < 2 and self._unit_scale(ctx, axis) else None)
        for axis, dim in sharded_dims(spec, rank) if spec is not None else ():
            if labels[axis] is None:
                ctx.diag(
                    codes.SPATIAL_AXIS_SHARDED,
                    f"axis {axis} of {ctx.input_name(0)!r} is cut in {dim.num_shards}, but "
                    f"{ctx.op_type} resizes it (or its scale is unknown): output rows would "
                    "need input rows of neighbouring shards",
                    f"replicate axis {axis} of {ctx.input_name(0)!r}",
                    tensor=ctx.input_name(0),
                    axis=axis,
                    given=text(spec),
                    expected=f"axis {axis} unsharded",
                )
                return []
        return contract(ctx, [Operand(spec, labels, sx)], [(ctx.node.output[0], labels)])

    @staticmethod
    def _unit_scale(ctx, axis: int) -> bool:
        index = 1 if ctx.op_type == "Upsample" else 2
        scales = ctx.constant(index)
        if scales is not None and scales.size > axis:
            return float(scales.ravel()[axis]) == 1.0
        return False


RULES = [Conv(), WindowedPool(), GlobalPool(), ChannelNorm(), Resize()]
