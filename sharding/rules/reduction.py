"""Reductions (0007): any input sharding; reduced axes drop out of the output.

``Reduce*`` (axes as attribute or, from opset 13/18, as input; keepdims;
noop_with_empty_axes) and ``ArgMax``/``ArgMin`` (one axis). A kept axis keeps
its sharding; a reduced axis that was sharded makes the partial results meet
in an all-reduce, and the output is replicated on every device that took part
(0007's default).

``TopK`` selects along one axis: the other axes keep their sharding, the
selected axis comes out whole (a sharded one is gathered first, like a
Softmax over a sharded axis); values and indices share one spec.
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.contract import Operand, contract
from sharding.rules.views import sharded_dims

REDUCE = frozenset(
    """
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd
    ReduceSum ReduceSumSquare
    """.split()
)
ARG = frozenset({"ArgMax", "ArgMin"})


def reduced_axes(ctx, rank):
    """The axes a reduction node reduces, normalised; None when unknown."""
    if ctx.op_type in ARG:
        return [int(ctx.attr("axis", 0)) % rank]
    axes = ctx.int_list("axes", 1)
    if axes is None and len(ctx.node.input) > 1 and ctx.node.input[1]:
        return None  # axes given as a non-constant input
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted({a % rank for a in axes})


class Reduction(Rule):
    ops = REDUCE | ARG

    def outputs(self, ctx, in_specs):
        spec = in_specs[0]
        rank = ctx.rank(0)
        name = ctx.node.output[0]
        if rank is None:
            if spec is not None and not sharded_dims(spec, None):
                return contract(ctx, [Operand(spec, [])], [(name, [])])
            ctx.unknown_rank(0)
            return [None]
        axes = reduced_axes(ctx, rank)
        if axes is None:
            if not sharded_dims(spec, rank):
                axes = list(range(rank))  # only the output's shape is unknown: stays replicated
            else:
                ctx.unknown("the reduced axes are not a constant", tensor=ctx.node.input[0])
                return [None]
        keep = int(ctx.attr("keepdims", 1))
        labels = list(range(rank))
        out = [None if a in axes else a for a in labels] if keep else [a for a in labels if a not in axes]
        return contract(ctx, [Operand(spec, labels, ctx.in_shapes[0])], [(name, out)])


class TopK(Rule):
    ops = frozenset({"TopK"})

    def outputs(self, ctx, in_specs):
        rank = ctx.data_rank()
        if rank is None:
            return []
        axis = int(ctx.attr("axis", -1)) % rank
        labels = list(range(rank))
        out = [None if a == axis else a for a in labels]
        return contract(
            ctx, [Operand(in_specs[0], labels, ctx.in_shapes[0])],
            [(name, out) for name in ctx.node.output if name], reduce_kind="all-gather",
        )


RULES = [Reduction(), TopK()]
