"""Gathers: the gathered axis of the data is a reduction axis, index axes pass through.

- Gather(data, indices, axis): output = data[:axis] + indices + data[axis+1:].
  A sharded data axis other than ``axis`` and any sharded index axis pass to
  the output. A data table sharded on ``axis`` (Megatron's vocabulary-parallel
  embedding) is valid: each device looks up the rows it holds, masks the rest,
  and the partial results meet in an all-reduce.
- GatherElements(data, indices, axis): output has the indices' shape; other
  axes pair up elementwise, the data's ``axis`` is reduced.
- GatherND(data, indices, batch_dims): batch axes pair up; the indexed data
  axes and the indices' last axis are reduced; the remaining axes pass.
"""

from __future__ import annotations

from sharding.rules.base import Rule
from sharding.rules.contract import Operand, contract
from sharding.rules.views import sharded_dims


class Gather(Rule):
    ops = frozenset({"Gather", "GatherElements", "GatherND"})

    def outputs(self, ctx, in_specs):
        data, indices = ctx.in_shapes[0], ctx.in_shapes[1] if len(ctx.in_shapes) > 1 else None
        if data is None or indices is None:
            if all(s is None or not sharded_dims(s, None) for s in in_specs):
                return contract(ctx, [Operand(s, []) for s in in_specs[:2]], [(ctx.node.output[0], [])])
            ctx.unknown("the ranks of data and indices are unknown")
            return []
        r, q = len(data), len(indices)
        op = ctx.op_type
        if op == "Gather":
            axis = int(ctx.attr("axis", 0)) % r
            ld = [("d", a) if a != axis else "gathered" for a in range(r)]
            li = [("i", j) for j in range(q)]
            out = ld[:axis] + li + ld[axis + 1 :]
        elif op == "GatherElements":
            axis = int(ctx.attr("axis", 0)) % r
            ld = [("d", a) if a != axis and data[a] == indices[a] else ("data", a) for a in range(r)]
            li = [("d", a) if a != axis and data[a] == indices[a] else ("i", a) for a in range(q)]
            out = li
        else:
            b = int(ctx.attr("batch_dims", 0))
            last = indices[-1]
            if not isinstance(last, int):
                ctx.unknown("the last axis of the indices has no fixed size", tensor=ctx.node.input[1])
                return []
            ld = [("b", a) for a in range(b)] + [("nd", a) for a in range(b, b + last)]
            ld += [("d", a) for a in range(b + last, r)]
            li = [("b", a) for a in range(b)] + [("i", j) for j in range(b, q - 1)] + ["index"]
            out = li[:-1] + ld[b + last :]
        operands = [Operand(in_specs[0], ld, data), Operand(in_specs[1], li, indices)]
        return contract(ctx, operands, [(ctx.node.output[0], out)], label_names={"gathered": f"the gathered axis {ctx.attr('axis', 0)} of {ctx.node.input[0]!r}"})


RULES = [Gather()]
