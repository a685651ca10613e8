"""onnxruntime's decoder attention ops (com.microsoft): GroupQueryAttention and RotaryEmbedding.

**GroupQueryAttention** shards over batch and heads (Megatron's attention; vLLM's kv-head replicas):

==================================  ==========================  ==========================================
input / output                      shape                       axes
==================================  ==========================  ==========================================
query (separate q)                  [B, S, H*D]                 batch; hidden by query heads
query (packed q|k|v, no key/value)  [B, S, (H + 2*KV)*D]        batch; hidden replicated, or, when H == KV,
                                                                the fused axis [{3, 1}, {H*D, w}]
key, value                          [B, S, KV*D]                batch; hidden by kv heads
past_key, past_value (BNSH)         [B, KV, P, D]               batch; axis 1 by kv heads
seqlens_k, position_ids              [B], [B, S]                 batch
attention_bias                      [B or 1, H or 1, S, T]      batch; axis 1 by query heads
total_sequence_length, cos/sin,     scalar, [positions, R/2]    whole
  head_sink
output                              [B, S, H*D]                 batch; hidden by query heads
present_key, present_value          [B, KV, T, D]               batch; axis 1 by kv heads
==================================  ==========================  ==========================================

Heads are one label cut two ways: query heads in ``w`` shards, kv heads in ``w'`` shards with ``w'``
dividing ``w`` (each kv shard on the devices of its ``w / w'`` query shards). Query head ``j`` reads kv head
``j // (H / KV)``, so with whole heads per shard (``w | H``, ``w' | KV``) the device of query block ``j``
holds kv block ``j // (w / w')``: exactly what it reads. Where ``w`` exceeds the kv heads, each kv head is
replicated on the group of devices whose query heads read it; ``w' = 1`` (kv whole on every device) is the
"replicate" mode. The output carries the query heads' cut (or, when the query is whole, the kv heads' cut:
the query heads of each kv group are computed where that group lives, a local slice); ``present`` carries
the kv heads' cut of key/value/past. No head is reduced, so the op itself costs no collective.

A packed q|k|v of unequal parts (H != KV) cannot be split by heads: DESIGN's fused axis views an axis as a
*product* of sub-axes, and a cut of it lands at the same relative place in every part, whereas q | k | v are
concatenated parts of widths H*D | KV*D | KV*D (the kv head of query block j sits at another relative
place). Such a query must be whole; the heads are split where the output and the cache are.

Sequence axes (S, P, T) and the head size D must be whole: attention mixes every position of a row, and
the new tokens' keys are written into the cache at each row's own length. A sharded one is an error.

**RotaryEmbedding** (x [B, S, hidden] or [B, N, S, D], position_ids [B, S] or a 1-element start, cos/sin
[positions, R/2]): batch and heads (N, or hidden by whole heads) pass through; S passes when the
positions are per token (2-D position_ids cut alike); D, cos and sin must be whole.
"""

from __future__ import annotations

from sharding import codes
from sharding.rules.base import Rule, text
from sharding.rules.contract import Operand, contract
from sharding.rules.views import clone_spec, dim_key, make_dim, node_devices, replicated, sharded_dims
from sharding.spec import ShardedDim

_QUERY, _KEY, _VALUE, _PAST_K, _PAST_V, _SEQLENS, _TOTAL, _COS, _SIN, _POS, _BIAS, _SINK = range(12)


def _whole(ctx, spec, axes, why: str, index: int) -> bool:
    """Reports each of ``axes`` that ``spec`` cuts (they must be whole); True when none is."""
    if spec is None:
        return True
    rank = ctx.rank(index)
    ok = True
    for axis, dim in sharded_dims(spec, rank):
        if axes is None or axis in axes:
            ctx.diag(
                codes.ATTENTION_AXIS_SHARDED,
                f"axis {axis} of {spec.tensor_name!r} is cut in {dim.num_shards}, but {why}",
                f"replicate {spec.tensor_name!r} along axis {axis}; {ctx.op_type} shards over batch and heads",
                tensor=spec.tensor_name,
                axis=axis,
                given=text(spec),
                expected=f"axis {axis} unsharded",
            )
            ok = False
    return ok


def _by_heads(ctx, spec, axis: int, heads: int, size, index: int) -> bool:
    """Reports a cut of ``axis`` (``heads`` heads over ``size`` elements) that splits a head."""
    if spec is None:
        return True
    for a, dim in sharded_dims(spec, ctx.rank(index)):
        if a != axis:
            continue
        key = dim_key(dim, size)
        if len(key) != 1 or heads % key[0]:
            ctx.diag(
                codes.ATTENTION_HEADS_SPLIT,
                f"axis {axis} of {spec.tensor_name!r} ({heads} heads) is cut as {text(spec)}, which does "
                "not give every shard whole heads",
                f"cut it in a divisor of {heads}",
                tensor=spec.tensor_name,
                axis=axis,
                given=text(spec),
                expected=f"a plain split in a divisor of {heads}",
            )
            return False
    return True


def _unfused_query(ctx, spec, heads: int, kv: int):
    """The packed query's spec on its ``[B, S, 3, H*D]`` view (H == KV, fused [{3,1},{H*D,w}]), the spec
    itself when its hidden axis is whole, or False (reported)."""
    if spec is None:
        return None
    shape = ctx.in_shapes[_QUERY]
    width = shape[2] if shape is not None else None
    dims = []
    for axis, dim in sharded_dims(spec, 3):
        if axis != 2:
            dims.append(ShardedDim(axis, dim.parts))
            continue
        key = dim_key(dim, width)
        parts = [p for p in key if not isinstance(p, int)] if len(key) > 1 else []
        if heads == kv and len(parts) == 2 and parts[0] == (3, 1) and heads % parts[1][1] == 0:
            dims.append(make_dim(3, [(parts[1][0], parts[1][1])]))
            continue
        why = (
            f"its parts q | k | v are {heads} | {kv} | {kv} heads wide: a fused axis (a product of sub-axes) "
            "cuts every part at the same relative place, so no cut gives each device the kv heads its query "
            "heads read" if heads != kv else "only the fused axis [{3, 1}, {H*D, w}] splits each part by heads"
        )
        ctx.diag(
            codes.ATTENTION_HEADS_SPLIT,
            f"the packed q|k|v {spec.tensor_name!r} is cut on its hidden axis as {text(spec)}; {why}",
            "replicate the packed query's hidden axis and split the heads on the output and the cache "
            "(present_key/present_value)" if heads != kv else "write the fused axis [{3, 1}, {H*D, w}]",
            tensor=spec.tensor_name,
            axis=2,
            given=text(spec),
            expected="hidden axis whole" if heads != kv else "[{3, 1}, {H*D, w}] on axis 2",
        )
        return False
    return clone_spec(spec.tensor_name, tuple(dims), spec.devices, spec.groups)


class GroupQueryAttention(Rule):
    ops = frozenset({"GroupQueryAttention"})
    domain = "com.microsoft"

    def outputs(self, ctx, in_specs):
        specs = list(in_specs) + [None] * (12 - len(in_specs))
        heads, kv = int(ctx.attr("num_heads")), int(ctx.attr("kv_num_heads"))
        packed = not ctx.input_name(_KEY)
        shapes = list(ctx.in_shapes) + [None] * (12 - len(ctx.in_shapes))
        ok = True
        seq = "attention mixes every position of a row (sequence axes and the head size stay whole)"
        ok &= _whole(ctx, specs[_QUERY], {1}, seq, _QUERY)
        for index in (_KEY, _VALUE):
            ok &= _whole(ctx, specs[index], {1}, seq, index)
        for index in (_PAST_K, _PAST_V):
            ok &= _whole(ctx, specs[index], {2, 3}, seq, index)
        ok &= _whole(ctx, specs[_POS], {1}, seq, _POS)
        for index in (_TOTAL, _COS, _SIN, _SINK):
            ok &= _whole(ctx, specs[index], None, "it is read whole (positions, lengths, per-head sinks)", index)
        ok &= _whole(ctx, specs[_BIAS], {2, 3}, seq, _BIAS)
        if not ok:
            return []
        batch = "b"
        query = specs[_QUERY]
        if packed:
            query = _unfused_query(ctx, query, heads, kv)
            if query is False:
                return []
            q_shape = shapes[_QUERY]
            if heads == kv:  # the [B, S, 3, H*D] view: q, k and v cut alike by heads
                width = q_shape[2] if q_shape is not None else None
                q_view = None if q_shape is None else (*q_shape[:2], 3, width // 3 if isinstance(width, int) else None)
                q_op = Operand(query, [batch, "s", "three", "h"], q_view)
            else:  # whole hidden axis (checked): only the batch may be cut
                q_op = Operand(query, [batch, "s", None], q_shape)
        else:
            q_op = Operand(query, [batch, "s", "h"], shapes[_QUERY])
            head_size = shapes[_QUERY][2] if shapes[_QUERY] is not None else None
            if not _by_heads(ctx, specs[_QUERY], 2, heads, head_size, _QUERY):
                return []
        kv_ops = []
        if not packed:
            for index in (_KEY, _VALUE):
                if not _by_heads(ctx, specs[index], 2, kv, shapes[index][2] if shapes[index] else None, index):
                    return []
                kv_ops.append(Operand(specs[index], [batch, "s", "h"], shapes[index]))
        for index in (_PAST_K, _PAST_V):
            if ctx.input_name(index):
                if not _by_heads(ctx, specs[index], 1, kv, kv, index):
                    return []
                kv_ops.append(Operand(specs[index], [batch, "h", "t", "d"], shapes[index]))
        if packed and heads == kv:
            kv_ops.append(q_op)
        others = []
        if ctx.input_name(_SEQLENS):
            others.append(Operand(specs[_SEQLENS], [batch], shapes[_SEQLENS]))
        if ctx.input_name(_POS) and shapes[_POS] is not None and len(shapes[_POS]) == 2:
            others.append(Operand(specs[_POS], [batch if shapes[_POS][0] != 1 else None, None], shapes[_POS]))
        if ctx.input_name(_BIAS) and shapes[_BIAS] is not None:
            bias_shape = shapes[_BIAS]
            labels = [batch if bias_shape[0] != 1 else None, "h" if bias_shape[1] != 1 else None, "s", "t"]
            others.append(Operand(specs[_BIAS], labels, bias_shape))
        names = {"h": "the heads", "b": "the batch"}
        q_ops = [q_op] if not (packed and heads == kv) else []
        out = contract(ctx, q_ops + kv_ops + others, [(ctx.node.output[0], [batch, "s", "h"])], label_names=names)
        outs = [out[0]]
        present = [(i, ctx.node.output[i]) for i in (1, 2) if i < len(ctx.node.output) and ctx.node.output[i]]
        if present:
            found = contract(ctx, kv_ops + [o for o in others if "h" not in o.labels],
                             [(name, [batch, "h", "t", "d"]) for _, name in present], label_names=names)
            # Nothing known about key/value/past (all unknown): the cache is whole where the node runs.
            whole = all(o.spec is None for o in kv_ops) and not any(d.severity == "error" for d in ctx.diagnostics)
            devices = node_devices(s for s in specs if s is not None)
            outs += [None, None]
            for (i, name), spec in zip(present, found, strict=True):
                outs[i] = replicated(name, devices) if spec is None and whole and devices else spec
        return outs


class RotaryEmbedding(Rule):
    ops = frozenset({"RotaryEmbedding"})
    domain = "com.microsoft"

    def outputs(self, ctx, in_specs):
        specs = list(in_specs) + [None] * (4 - len(in_specs))
        shape = ctx.in_shapes[0]
        rank = ctx.data_rank()
        if rank is None:
            return []
        per_token = ctx.in_shapes[1] is not None and len(ctx.in_shapes[1]) == 2
        why = "rotary positions are read whole"
        ok = _whole(ctx, specs[2], None, why, 2) & _whole(ctx, specs[3], None, why, 3)
        if rank == 4:
            labels = ["b", "n", "s", "d"]
            ok &= _whole(ctx, specs[0], {3}, "the rotation mixes the two halves of each head", 0)
        else:
            labels = ["b", "s", "h"]
            num_heads = int(ctx.attr("num_heads", 0))
            if num_heads == 0 and ctx.in_shapes[2] is not None and shape is not None and isinstance(shape[2], int):
                rotary = 2 * ctx.in_shapes[2][1] if isinstance(ctx.in_shapes[2][1], int) else None
                num_heads = shape[2] // rotary if rotary else 0
            if num_heads:
                ok &= _by_heads(ctx, specs[0], 2, num_heads, shape[2] if shape else None, 0)
            elif specs[0] is not None and any(a == 2 for a, _ in sharded_dims(specs[0], 3)):
                ctx.unknown("the number of heads is unknown (num_heads and the cos cache's shape)")
                return []
        if not per_token:
            ok &= _whole(ctx, specs[0], {rank - 2 if rank == 4 else 1},
                         "the positions are one start offset for the whole sequence", 0)
        if not ok:
            return []
        operands = [Operand(specs[0], labels, shape)]
        if per_token:
            operands.append(Operand(specs[1], ["b", "s"], ctx.in_shapes[1]))
        return contract(ctx, operands, [(ctx.node.output[0], labels)])


RULES = [GroupQueryAttention(), RotaryEmbedding()]
