"""Sharding rules, one module per op group; each rule serves checking and inference.

This package only assembles the rules into `RULES`; what they share is in
`base` (the `Rule` base and `NodeContext`), `views` (spec views) and the two
engines `contract` and `regroup`, which the rule modules import directly.

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
contrib_*       onnxruntime's ops (com.microsoft, and SimplifiedLayerNormalization
                in the default domain): GroupQueryAttention, RotaryEmbedding,
                Skip(Simplified)LayerNormalization, MatMulNBits
==============  ==============================================================

A rule's ``domain`` attribute (default ``""``) names the domain of its ops.
"""

from __future__ import annotations

from sharding.rules import broadcast, conv, gather, matmul, normalization, reduction, shape, unary, values
from sharding.rules import contrib_attention, contrib_normalization, contrib_quantization
from sharding.rules.base import NodeContext as NodeContext  # with Rule, what a new rule is written against
from sharding.rules.base import Rule as Rule


_MODULES = (
    unary, broadcast, reduction, normalization, matmul, shape, gather, values, conv,
    contrib_attention,
    contrib_normalization,
    contrib_quantization,
)


def _registry(domain: str) -> dict[str, Rule]:
    table: dict[str, Rule] = {}
    for module in _MODULES:
        for rule in module.RULES:
            if getattr(rule, "domain", "") != domain:
                continue
            for op in rule.ops:
                if op in table:
                    raise ValueError(f"two sharding rules for {domain or 'ai.onnx'}::{op}")
                table[op] = rule
    return table


RULES: dict[str, Rule] = _registry("")
MICROSOFT_RULES: dict[str, Rule] = _registry("com.microsoft")


def rule_for(op_type: str, domain: str = "") -> Rule | None:
    """The rule for an op of the default ONNX domain or of onnxruntime's com.microsoft, or None."""
    if domain in ("", "ai.onnx"):
        return RULES.get(op_type)
    if domain == "com.microsoft":
        return MICROSOFT_RULES.get(op_type)
    return None
