"""onnxruntime's RMS/Layer norms with a residual (the model builder's): reductions over the last axis.

Like `sharding.rules.normalization` (DESIGN: "Normalisations and Softmax behave as reductions over their
axes"): the normalised axes come out whole on every device that took part, the other axes keep their
sharding; a sharded normalised axis is valid but its pieces meet in an all-gather (a ``collective`` note),
so inference never shards it.

===================================  ===============================================================
op                                   inputs -> outputs
===================================  ===============================================================
SimplifiedLayerNormalization         X, scale -> Y, inv_std_var; RMSNorm over ``axis..`` (default -1)
SkipSimplifiedLayerNormalization     input, skip, gamma, bias -> output, mean, inv_std_var,
  (com.microsoft)                    input_skip_bias_sum; RMSNorm of input + skip (+ bias), last axis
SkipLayerNormalization               input, skip, gamma, beta, bias -> the same four; LayerNorm of
  (com.microsoft)                    input + skip (+ bias) over the last axis
===================================  ===============================================================

The residual sum ``input_skip_bias_sum`` is elementwise: it keeps every axis's sharding, the last one
included. ``mean`` and ``inv_std_var`` have size 1 on the normalised axes.
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.contract import Operand, contract, elementwise_labels


def _norm_specs(ctx, in_specs, data: list[int], params: list[int], axis: int, stats: list[int], sums: list[int]):
    """Output specs of a norm of the elementwise sum of inputs ``data`` over axes ``axis..``.

    ``params`` (scale, bias...) broadcast against the normalised axes; outputs ``stats`` have size 1 there,
    output 0 is the normalised value, outputs ``sums`` are the elementwise sum (every axis kept).
    """
    rank = ctx.data_rank()
    if rank is None:
        return []
    shape = ctx.in_shapes[0]
    axis %= rank
    labels = list(range(rank))
    kept = [None if a >= axis else a for a in labels]
    operands = [Operand(in_specs[0], labels, shape)]
    for i in data[1:] + params:
        if i < len(in_specs) and ctx.input_name(i):
            labels_i = elementwise_labels(ctx.in_shapes[i], rank, shape)
            if labels_i is not None:
                operands.append(Operand(in_specs[i], labels_i, ctx.in_shapes[i]))
    wanted = [(0, kept)] + [(i, kept) for i in stats] + [(i, labels) for i in sums]
    present = [(i, lab) for i, lab in wanted if i < len(ctx.node.output) and ctx.node.output[i]]
    results = contract(ctx, operands, [(ctx.node.output[i], lab) for i, lab in present], reduce_kind="all-gather")
    outs = [None] * len(ctx.node.output)
    for (i, _), spec in zip(present, results, strict=True):
        outs[i] = spec
    return outs


class SimplifiedLayerNormalization(Rule):
    """RMSNorm over ``axis..``; output 1 (inv_std_var) is size 1 there."""

    ops = frozenset({"SimplifiedLayerNormalization"})
    domain = ""

    def outputs(self, ctx, in_specs):
        return _norm_specs(ctx, in_specs, [0], [1], int(ctx.attr("axis", -1)), [1], [])


class SkipNormalization(Rule):
    """Norm of input + skip (+ bias) over the last axis, and the sum itself (output 3)."""

    ops = frozenset({"SkipSimplifiedLayerNormalization", "SkipLayerNormalization"})
    domain = "com.microsoft"

    def outputs(self, ctx, in_specs):
        params = [2, 3] if ctx.op_type == "SkipSimplifiedLayerNormalization" else [2, 3, 4]
        return _norm_specs(ctx, in_specs, [0, 1], params, -1, [1, 2], [3])


RULES = [SimplifiedLayerNormalization(), SkipNormalization()]
