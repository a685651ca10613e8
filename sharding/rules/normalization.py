"""Normalisations, Softmax and scans: reductions over their axes that keep the shape.

DESIGN: "Normalisations and Softmax behave as reductions over their axes".
The output has the input's shape; the normalised axes come out whole
(unsharded) on every device that took part, the other axes keep their
sharding. Sharding a normalised axis is valid but costs a collective; an
inferred spec therefore never shards it (so that, say, a LayerNorm over the
hidden axis stays local).

**What a split normalised axis costs, and which way is cheaper.** With the
input ``[..., H]`` split n ways on H there are two programs:

* gather the input once (``(n-1)/n`` of ``x`` per device), then normalise
  locally: the output is whole;
* compute the statistics as partial sums, one all-reduce each of ``[..., 1]``
  (LayerNorm: mean and variance, 2; RMSNorm: the mean square, 1; Softmax: the
  max and the sum, 2), and normalise each shard locally: the output keeps the
  split.

When the output must be whole (the inferred spec, or a written one), the
first moves fewer bytes: the second would still gather the output, after its
all-reduces (XLA's choice when left alone: 2 all-reduces and an all-gather for
LayerNorm). When the written output keeps the split, the second moves ``H/2``
times fewer bytes than the first and nothing is gathered. The rule predicts
the one all-gather; `statistics_kept_split` turns that prediction into the
statistics' all-reduces when the written output keeps the split; the runtime
emits exactly these (`onnx2jax.runtime.constraints.ShardingHooks._gather_before_norm`).

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

import dataclasses

from sharding import codes
from sharding.diagnostics import Diagnostic
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

# All-reduces of per-row statistics when a normalised axis stays split: what each op sums.
STATISTICS = {
    "LayerNormalization": ("the mean", "the variance"),
    "RMSNormalization": ("the mean square",),
    "Softmax": ("the max", "the sum of exponentials"),
    "LogSoftmax": ("the max", "the sum of exponentials"),
}


def statistics_kept_split(
    op_type: str, tensor: str, notes: list[Diagnostic], keeps_input_split: bool
) -> tuple[Diagnostic, list[Diagnostic]] | None:
    """A norm whose written output ``tensor`` keeps its input's split (``keeps_input_split``).

    Returns the rule's all-gather note for ``tensor`` and the notes that
    replace it (one all-reduce per statistic, see the module docstring), or
    None when this is not that case.
    """
    if op_type not in STATISTICS or not keeps_input_split:
        return None
    gathers = [d for d in notes if d.code == codes.COLLECTIVE and d.tensor == tensor and d.expected == "all-gather"]
    if len(gathers) != 1:
        return None
    devices = gathers[0].message.rsplit("over devices ", 1)[-1]
    replacement = [
        dataclasses.replace(
            gathers[0],
            message=f"the normalised axis stays split as written: {what} meets in an all-reduce of one "
            f"value per row over devices {devices} (cheaper than gathering the input)",
            expected="all-reduce",
        )
        for what in STATISTICS[op_type]
    ]
    return gathers[0], replacement
