"""Unary elementwise ops: any input sharding is valid; the output keeps it (0007).

Covers 0007's list and every other one-input elementwise op; extra inputs
(Clip's bounds, Dropout's ratio, CastLike's target) are scalars or types and
take no part.
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.views import renamed

OPS = frozenset(
    """
    Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Cast CastLike Ceil Celu Clip Cos Cosh
    DequantizeLinear Dropout Elu Erf Exp Floor Gelu HardSigmoid HardSwish
    Identity IsInf IsNaN LeakyRelu Log Mish Neg Not QuantizeLinear Reciprocal Relu Round Selu
    Shrink Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Swish Tan Tanh ThresholdedRelu
    """.split()
)


class Unary(Rule):
    ops = OPS

    def outputs(self, ctx, in_specs):
        spec = in_specs[0] if in_specs else None
        if spec is None:
            return []
        # Dropout's mask has the input's shape too.
        outs = [renamed(spec, name) if name else None for name in ctx.node.output]
        return outs


RULES = [Unary()]
