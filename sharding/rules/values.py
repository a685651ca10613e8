"""Ops whose outputs are small values computed from shapes or scalars.

``Shape``, ``Size``, ``Range``, ``ConstantOfShape``, ``EyeLike``, ``NonZero``...:
whatever the input sharding, the output is replicated on every device of the
node (0007 lists ConstantOfShape with the unary ops; its input is a shape).
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.views import node_devices, replicated

OPS = frozenset(
    """
    Shape Size Range ConstantOfShape EyeLike NonZero RandomNormalLike RandomUniformLike
    Bernoulli Multinomial
    """.split()
)


class Values(Rule):
    ops = OPS

    def outputs(self, ctx, in_specs):
        found = node_devices(in_specs)
        if not found:
            return []
        return [replicated(name, found) if name else None for name in ctx.node.output]


RULES = [Values()]
