"""MatMul-like ops (0007): broadcast on M and N, reduction on K.

``A[..., M, K] @ B[..., K, N]`` is the broadcast product ``A[..., M, K, 1] *
B[..., 1, K, N]`` summed over K. M and N shard freely and pass to the output;
batch axes broadcast like elementwise ops; the K axes of both inputs must be
sharded the same way, and a sharded K makes the partial products meet in an
all-reduce (Megatron's row-parallel linear). Covers MatMul (1-D and batched
with broadcast batch axes), Gemm (transA/transB, C broadcast to [M, N]),
MatMulInteger and QLinearMatMul (per-row / per-column zero points and scales
follow M / N) and Einsum (any equation without a label repeated inside one
operand: each label is an axis, the labels missing from the output are
reduced).
"""

from __future__ import annotations

import re

from sharding import codes
from sharding.rules.base import Rule, text
from sharding.rules.contract import Operand, contract, elementwise_labels
from sharding.rules.views import sharded_dims

NAMES = {"m": "M", "n": "N", "k": "K"}


def _batch(shape, rank, nb, out_shape):
    offset = nb - rank
    labels = []
    for i in range(rank):
        size = shape[i] if shape is not None else None
        out_size = out_shape[i + offset] if out_shape is not None and i + offset < len(out_shape) else None
        labels.append(None if size == 1 and out_size != 1 else ("b", i + offset))
    return labels


def matmul_labels(sa, sb, out_shape):
    """Labels of A, B and the output of ``A @ B`` (numpy matmul rules)."""
    ra, rb = len(sa), len(sb)
    nb = max(ra - 2, rb - 2, 0)
    a = ["k"] if ra == 1 else [*_batch(sa, ra - 2, nb, out_shape), "m", "k"]
    b = ["k"] if rb == 1 else [*_batch(sb, rb - 2, nb, out_shape), "k", "n"]
    out = [("b", j) for j in range(nb)] + (["m"] if ra >= 2 else []) + (["n"] if rb >= 2 else [])
    return a, b, out


def _side_labels(shape, label):
    """Labels of a zero point or scale: scalar, or 1-D along M (or N)."""
    if shape is None or len(shape) == 0 or shape == (1,):
        return [None] * (0 if shape is None else len(shape))
    return [label] if len(shape) == 1 else [None] * len(shape)


def _k_conflict(ctx, specs, operands, k_axes):
    """Rewrites an empty intersection caused by K shardings that differ into one clear error."""
    (ia, ka), (ib, kb) = k_axes
    a, b = specs[ia], specs[ib]
    if a is None or b is None:
        return
    cut_a = dict(sharded_dims(a, len(operands[0].labels))).get(ka)
    cut_b = dict(sharded_dims(b, len(operands[1].labels))).get(kb)
    if (cut_a is None) == (cut_b is None) and (cut_a is None or cut_a.num_shards == cut_b.num_shards):
        return
    empties = [d for d in ctx.diagnostics if d.code == codes.EMPTY_INTERSECTION]
    if not empties:
        return
    for d in empties:
        ctx.diagnostics.remove(d)
    names = (ctx.node.input[ia], ctx.node.input[ib])
    how = lambda cut: "not sharded" if cut is None else f"sharded in {cut.num_shards}"  # noqa: E731
    if cut_a is not None:
        wrong, axis, right, right_axis = names[1], kb, names[0], ka
    else:
        wrong, axis, right, right_axis = names[0], ka, names[1], kb
    ctx.diag(
        codes.K_SHARDING_MISMATCH,
        f"the contracted axis K is {how(cut_a)} on {names[0]!r} (axis {ka}) but {how(cut_b)} on "
        f"{names[1]!r} (axis {kb}): no device holds matching K blocks of both",
        f"shard {wrong!r} on axis {axis} over the same devices as axis {right_axis} of {right!r}",
        tensor=wrong,
        axis=axis,
        given=text(specs[ib] if wrong == names[1] else specs[ia]),
        expected=f"axis {axis} sharded like {right!r}'s axis {right_axis} ({text(specs[ia] if wrong == names[1] else specs[ib])})",
    )


class MatMul(Rule):
    ops = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul"})

    def outputs(self, ctx, in_specs):
        ia, ib = (0, 3) if ctx.op_type == "QLinearMatMul" else (0, 1)
        sa, sb = ctx.in_shapes[ia], ctx.in_shapes[ib]
        if sa is None or sb is None:
            ctx.unknown("the ranks of the inputs are unknown")
            return []
        out_shape = ctx.out_shapes[0] if ctx.out_shapes else None
        la, lb, out = matmul_labels(sa, sb, out_shape)
        operands = [Operand(in_specs[ia], la, sa), Operand(in_specs[ib], lb, sb)]
        extra = {"MatMulInteger": {2: "m", 3: "n"}, "QLinearMatMul": {1: "m", 2: "m", 4: "n", 5: "n"}}
        for i, label in extra.get(ctx.op_type, {}).items():
            if i < len(in_specs) and ctx.input_name(i):
                operands.append(Operand(in_specs[i], _side_labels(ctx.in_shapes[i], label), ctx.in_shapes[i]))
        specs = {ia: in_specs[ia], ib: in_specs[ib]}
        result = contract(ctx, operands, [(ctx.node.output[0], out)], label_names=NAMES,
                          mismatch_code={"k": codes.K_SHARDING_MISMATCH})
        _k_conflict(ctx, specs, operands, ((ia, len(la) - 1), (ib, 0 if len(lb) == 1 else len(lb) - 2)))
        return result


class Gemm(Rule):
    ops = frozenset({"Gemm"})

    def outputs(self, ctx, in_specs):
        la = ["k", "m"] if ctx.attr("transA", 0) else ["m", "k"]
        lb = ["n", "k"] if ctx.attr("transB", 0) else ["k", "n"]
        operands = [Operand(in_specs[0], la, ctx.in_shapes[0]), Operand(in_specs[1], lb, ctx.in_shapes[1])]
        if len(in_specs) > 2 and ctx.input_name(2):
            out_shape = ctx.out_shapes[0] if ctx.out_shapes else None
            labels = elementwise_labels(ctx.in_shapes[2], 2, out_shape)
            if labels is None:
                if sharded_dims(in_specs[2], None) if in_specs[2] is not None else False:
                    ctx.unknown("the shape of the sharded C input is unknown", tensor=ctx.node.input[2])
                    return []
                labels = []
            operands.append(Operand(in_specs[2], [None if x is None else "mn"[x] for x in labels], ctx.in_shapes[2]))
        result = contract(ctx, operands, [(ctx.node.output[0], ["m", "n"])], label_names=NAMES,
                          mismatch_code={"k": codes.K_SHARDING_MISMATCH})
        _k_conflict(ctx, in_specs, operands, ((0, la.index("k")), (1, lb.index("k"))))
        return result


def parse_einsum(equation, ranks):
    """Labels per operand and for the output; None when the equation is out of scope."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        return None
    labels = []
    ell = 0
    for term, rank in zip(terms, ranks, strict=True):
        if "..." in term:
            if rank is None:
                return None
            head, _, tail = term.partition("...")
            n = rank - len(head) - len(tail)
            ell = max(ell, n)
            # Ellipsis axes are right-aligned: the last one is ("e", 0).
            labels.append([*head, *[("e", n - 1 - i) for i in range(n)], *tail])
        else:
            labels.append(list(term))
    if any(len(set(x)) != len(x) for x in labels):
        return None
    if arrow:
        head, _, tail = rhs.partition("...")
        out = [*head, *([("e", ell - 1 - i) for i in range(ell)] if "..." in rhs else []), *tail]
    else:
        letters = [c for term in terms for c in term.replace("...", "")]
        out = [("e", ell - 1 - i) for i in range(ell)] + sorted(c for c in set(letters) if letters.count(c) == 1)
    if not re.fullmatch(r"[A-Za-z.,>-]*", eq):
        return None
    return labels, out


class Einsum(Rule):
    ops = frozenset({"Einsum"})

    def outputs(self, ctx, in_specs):
        ranks = [len(s) if s is not None else None for s in ctx.in_shapes]
        parsed = parse_einsum(ctx.attr("equation", ""), ranks)
        if parsed is None:
            if any(s is not None and sharded_dims(s, None) for s in in_specs):
                ctx.diag(codes.EINSUM_UNSUPPORTED,
                         f"equation {ctx.attr('equation', '')!r} is outside the MatMul-like cases "
                         "(a label repeated inside one operand, or ranks unknown)",
                         "rewrite it as MatMul, or leave its inputs unsharded", severity="warning")
            return []
        labels, out = parsed
        operands = []
        for spec, lab, shape in zip(in_specs, labels, ctx.in_shapes, strict=False):
            # Broadcast ellipsis axes of size 1 take no part.
            if shape is not None:
                lab = [None if isinstance(x, tuple) and shape[i] == 1 else x for i, x in enumerate(lab)]
            operands.append(Operand(spec, lab, shape))
        return contract(ctx, operands, [(ctx.node.output[0], out)])


RULES = [MatMul(), Gemm(), Einsum()]
