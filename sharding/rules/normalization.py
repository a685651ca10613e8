"""Normalisations, Softmax and scans: reductions over their axes that keep the shape.

DESIGN: "Normalisations and Softmax behave as reductions over their axes".
The output has the input's shape; the normalised axes come out whole
(unsharded) on every device that took part, the other axes keep their
sharding. Sharding a normalised axis is valid but costs a collective; an
inferred spec therefore never shards it (so that, say, a LayerNorm over the
hidden axis stays local).

============================  ===============================================
op                            normalised axes
============================  ===============================================
Softmax, LogSoftmax, Hardmax  ``axis`` (opset >= 13); ``axis..`` before 13
LayerNormalization            ``axis..`` (default -1); also Mean, InvStdDev
RMSNormalization              ``axis..`` (default -1)
LpNormalization, CumSum       ``axis`` (CumSum: constant input 1)
MeanVarianceNormalization     ``axes`` (default [0, 2, 3])
============================  ===============================================
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.contract import Operand, contract, elementwise_labels
from sharding.rules.views import sharded_dims

SOFTMAX = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
TRAILING = frozenset({"LayerNormalization", "RMSNormalization"})
SINGLE = frozenset({"LpNormalization", "CumSum"})
MVN = frozenset({"MeanVarianceNormalization"})


def normalised_axes(ctx, rank):
    op = ctx.op_type
    if op in SOFTMAX:
        if ctx.opset >= 13:
            return [int(ctx.attr("axis", -1)) % rank]
        return list(range(int(ctx.attr("axis", 1)) % rank, rank))
    if op in TRAILING:
        return list(range(int(ctx.attr("axis", -1)) % rank, rank))
    if op == "LpNormalization":
        return [int(ctx.attr("axis", -1)) % rank]
    if op == "CumSum":
        value = ctx.constant(1)
        return None if value is None else [int(value.ravel()[0]) % rank]
    return sorted({a % rank for a in ctx.attr("axes", [0, 2, 3])})


class Normalization(Rule):
    ops = SOFTMAX | TRAILING | SINGLE | MVN

    def outputs(self, ctx, in_specs):
        spec = in_specs[0]
        rank = ctx.data_rank()
        if rank is None:
            return []
        axes = normalised_axes(ctx, rank)
        if axes is None:
            if sharded_dims(spec, rank):
                ctx.unknown("the scan axis is not a constant", tensor=ctx.node.input[0])
                return []
            axes = list(range(rank))
        labels = list(range(rank))
        kept = [None if a in axes else a for a in labels]
        shape = ctx.in_shapes[0]
        operands = [Operand(spec, labels, shape)]
        if ctx.op_type in TRAILING:
            # Scale and bias broadcast against the normalised trailing axes.
            for i in (1, 2):
                if i < len(in_specs) and ctx.input_name(i):
                    labels_i = elementwise_labels(ctx.in_shapes[i], rank, shape)
                    if labels_i is not None:
                        operands.append(Operand(in_specs[i], labels_i, ctx.in_shapes[i]))
        outputs = [(ctx.node.output[0], kept)]
        for extra in ctx.node.output[1:3] if ctx.op_type == "LayerNormalization" else ():
            outputs.append((extra, kept))  # Mean / InvStdDev: size 1 on normalised axes
        return contract(ctx, operands, outputs, reduce_kind="all-gather")


RULES = [Normalization()]
