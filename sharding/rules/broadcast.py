"""Broadcast n-ary elementwise ops (0007): non-broadcast axes alike, broadcast axes composed.

Every input is aligned right against the output (numpy broadcasting). An
axis of size 1 facing a larger one is broadcast and must not be sharded; an
axis that two inputs shard must be sharded the same way, or one cut must
evenly refine the other (8 blocks against 4 on device pairs: GQA's repeated
heads); an input that leaves an axis whole (a replicated constant, a bias) is
compatible with any sharding of it. Output block ``[i, j, ...]`` lives on the intersection of the devices
of the input shards it uses (see `_core.contract`); an empty intersection is
an error.
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.contract import Operand, contract, elementwise_labels
from sharding.rules.views import renamed, sharded_dims

OPS = frozenset(
    """
    Add And BitShift BitwiseAnd BitwiseOr BitwiseXor Div Equal Greater GreaterOrEqual Less
    LessOrEqual Max Mean Min Mod Mul Or Pow PRelu Sub Sum Where Xor
    """.split()
)


def broadcast_outputs(ctx, in_specs, inputs):
    """Output spec of elementwise inputs ``inputs`` (positions) broadcast together."""
    name = ctx.node.output[0]
    out_shape = ctx.out_shapes[0] if ctx.out_shapes else None
    shapes = [ctx.in_shapes[i] if i < len(ctx.in_shapes) else None for i in inputs]
    if out_shape is None and all(s is not None for s in shapes):
        out_rank = max((len(s) for s in shapes), default=0)
    else:
        out_rank = None if out_shape is None else len(out_shape)
    operands = []
    for i, shape in zip(inputs, shapes, strict=True):
        spec = in_specs[i] if i < len(in_specs) else None
        labels = elementwise_labels(shape, out_rank, out_shape) if out_rank is not None else None
        if labels is None:
            if spec is not None and sharded_dims(spec, None):
                known = [s for s in in_specs if s is not None]
                if all(renamed(s, "") == renamed(spec, "") for s in known):
                    return [renamed(spec, name)]  # identical specs: no shapes needed
                ctx.unknown(f"the shape of sharded input {ctx.node.input[i]!r} is unknown",
                            tensor=ctx.node.input[i])
                return [None]
            labels = []
        operands.append(Operand(spec, labels, shape))
    return contract(ctx, operands, [(name, list(range(out_rank or 0)))])


class Broadcast(Rule):
    ops = OPS

    def outputs(self, ctx, in_specs):
        return broadcast_outputs(ctx, in_specs, [i for i, n in enumerate(ctx.node.input) if n])


RULES = [Broadcast()]
