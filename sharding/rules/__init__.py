"""Sharding rules, one module per op group; each rule serves checking and inference.

A rule declares the op types it covers and has one method,
``propagate(ctx, in_specs) -> (out_specs, diagnostics)``: given the node
(`NodeContext`: attributes, shapes, constants) and one spec per input (None
where nothing is known), it returns one spec per output and every problem it
found with the inputs. `infer` fills missing specs from the out specs;
`check` reports the diagnostics and compares written output specs with the
inferred ones (a difference is a reshard, not an error).

Groups (proposal 0007 and DESIGN "Checking and inference"):

==============  ==============================================================
module          ops
==============  ==============================================================
unary           every one-input elementwise op (Relu, Gelu, Cast, Clip, ...)
broadcast       n-ary elementwise ops with numpy broadcasting (Add, Where, ...)
reduction       Reduce*, ArgMax, ArgMin, TopK
normalization   Softmax, LogSoftmax, LayerNormalization, RMSNormalization, ...
matmul          MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum
shape           Reshape, Transpose, Squeeze, Unsqueeze, Flatten, Concat, Split,
                Slice, Expand, Tile
gather          Gather, GatherElements, GatherND
conv            Conv, ConvTranspose, ConvInteger, QLinearConv, MaxPool, AveragePool,
                LpPool, Global*Pool, BatchNormalization, InstanceNormalization, Resize
values          Shape, Size, Range, ConstantOfShape, ... (small replicated values)
==============  ==============================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from sharding.diagnostics import Diagnostic
from sharding.spec import ShardingSpec
from sharding.rules.core import NodeContext as NodeContext


class Rule:
    """Base of all rules: subclasses set ``ops`` and implement `outputs`."""

    ops: frozenset[str] = frozenset()

    def propagate(
        self, ctx: NodeContext, in_specs: Sequence[ShardingSpec | None]
    ) -> tuple[list[ShardingSpec | None], list[Diagnostic]]:
        """Output specs of the node and the problems found (see the module docstring)."""
        outs = list(self.outputs(ctx, list(in_specs)))
        outs += [None] * (len(ctx.node.output) - len(outs))
        outs = [None if not name else spec for name, spec in zip(ctx.node.output, outs, strict=False)]
        return outs, list(ctx.diagnostics)

    def outputs(
        self, ctx: NodeContext, in_specs: list[ShardingSpec | None]
    ) -> list[ShardingSpec | None]:  # pragma: no cover - abstract
        raise NotImplementedError


def _registry() -> dict[str, Rule]:
    from sharding.rules import broadcast, conv, gather, matmul, normalization, reduction, shape, unary, values

    table: dict[str, Rule] = {}
    for module in (unary, broadcast, reduction, normalization, matmul, shape, gather, values, conv):
        for rule in module.RULES:
            for op in rule.ops:
                if op in table:
                    raise ValueError(f"two sharding rules for {op}")
                table[op] = rule
    return table


RULES: dict[str, Rule] = _registry()


def rule_for(op_type: str, domain: str = "") -> Rule | None:
    """The rule for an op of the default ONNX domain, or None."""
    if domain not in ("", "ai.onnx"):
        return None
    return RULES.get(op_type)
