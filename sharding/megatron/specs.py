"""The specs the Megatron plan writes: column, row, and the parts of an unequal fused projection.

Each builder returns `Assignment`s (node, spec, role) for one linear; the
devices of a ``w``-way split over ``n`` devices are shard i on device i, or
on the i-th group of ``n / w`` consecutive devices when ``w < n``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from sharding.megatron.graph import PlanGraph
from sharding.megatron.linears import Linear
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

@dataclass(frozen=True)
class Assignment:
    """One spec the plan writes: on which node, in which role."""

    node: str
    spec: ShardingSpec
    role: str

def _devices(ways: int, num_devices: int) -> list:
    """Shard i on device i, or on the i-th group of ``num_devices // ways`` consecutive devices.

    E.g. 4 ways over 8 devices: ``[{0,1}, {2,3}, {4,5}, {6,7}]``.
    """
    if ways == num_devices:
        return list(range(num_devices))
    group = num_devices // ways
    return [range(i * group, (i + 1) * group) for i in range(ways)]

def split_spec(
    tensor: str, axis: int, ways: int, num_devices: int, fused: int = 1, size: int = 0
) -> ShardingSpec:
    """``axis`` in ``ways`` shards; with ``fused=k`` the axis (of ``size``) is k parts, each cut."""
    spec = ShardingSpec.split(tensor, {axis: ways}, _devices(ways, num_devices))
    if fused == 1:
        return spec
    # Fused axis: sub-axes [k, size/k], only the inner one cut. With k=3,
    # size=192, ways=8: device d holds columns [8d, 8d+8) of each 64-wide part.
    dim = ShardedDim(
        axis,
        (SimpleShardedDim(1, dim_value=fused), SimpleShardedDim(ways, dim_value=size // fused)),
    )
    return dataclasses.replace(spec, sharded_dims=(dim,))

def replicated_spec(tensor: str, num_devices: int) -> ShardingSpec:
    return ShardingSpec.replicated(tensor, range(num_devices))

def column_specs(lin: Linear, ways: int, n: int, role: str) -> list[Assignment]:
    def cut(tensor: str, axis: int) -> ShardingSpec:
        return split_spec(tensor, axis, ways, n, lin.parts, lin.out_features)

    n_axis = 1 - lin.k_axis
    out = [
        Assignment(lin.node, replicated_spec(lin.activation, n), role),
        Assignment(lin.node, cut(lin.weight, n_axis), role),
    ]
    if lin.transpose:  # the parameter [N, K] or [K, N] behind the Transpose
        out.append(Assignment(lin.transpose, cut(lin.parameter, lin.k_axis), role))
        out.append(Assignment(lin.transpose, cut(lin.weight, n_axis), role))
    for tensor, shape in lin.quant:  # MatMulNBits' scales/zero points: N-major, [N, blocks] or flat
        out.append(Assignment(lin.node, split_spec(tensor, 0, ways, n, lin.parts, shape[0] if shape else 0), role))
    if lin.bias is not None and lin.bias[0] == lin.node:  # Gemm's C: [N], [1, N] or [M, N]
        out.append(Assignment(lin.node, cut(lin.bias[1], -1), role))
    out.append(Assignment(lin.node, cut(lin.matmul_output, -1), role))
    if lin.bias is not None and lin.bias[0] != lin.node:  # MatMul + Add(bias)
        out.append(Assignment(lin.bias[0], cut(lin.matmul_output, -1), role))
        out.append(Assignment(lin.bias[0], cut(lin.bias[1], 0), role))
        out.append(Assignment(lin.bias[0], cut(lin.output, -1), role))
    return out

def row_specs(lin: Linear, ways: int, n: int, role: str) -> list[Assignment]:
    out = [
        Assignment(lin.node, split_spec(lin.activation, lin.activation_k_axis, ways, n), role),
        Assignment(lin.node, split_spec(lin.weight, lin.k_axis, ways, n), role),
    ]
    if lin.transpose:
        out.append(Assignment(lin.transpose, split_spec(lin.parameter, 1 - lin.k_axis, ways, n), role))
        out.append(Assignment(lin.transpose, split_spec(lin.weight, lin.k_axis, ways, n), role))
    for tensor, shape in lin.quant:  # by K blocks: axis 1, or the inner sub-axis of a flat [N * blocks]
        if len(shape) == 1:
            spec = split_spec(tensor, 0, ways, n, lin.out_features, shape[0])
        else:
            spec = split_spec(tensor, 1, ways, n)
        out.append(Assignment(lin.node, spec, role))
    if lin.bias is not None and lin.bias[0] == lin.node:
        out.append(Assignment(lin.node, replicated_spec(lin.bias[1], n), role))
    out.append(Assignment(lin.node, replicated_spec(lin.matmul_output, n), role))
    if lin.bias is not None and lin.bias[0] != lin.node:
        for tensor in (lin.matmul_output, lin.bias[1], lin.output):
            out.append(Assignment(lin.bias[0], replicated_spec(tensor, n), role))
    return out

def piece_specs(
    graph: PlanGraph, col: Linear, ways: int, n: int, use_heads: bool, gqa: str, layer: int,
    kind: str, notes: list[str],
) -> list[Assignment]:
    """A fused projection cut into unequal parts: the projection stays replicated, each part
    is cut out replicated, and its readers take it split by heads (a local slice of a
    replicated tensor, no collective). Splitting the Split/Slice outputs themselves would
    let XLA shard the fused tensor evenly first and shift the parts into place with
    collective-permutes."""
    role = f"L{layer} {kind} part"
    what = "heads" if use_heads else "features"
    out: list[Assignment] = []
    split = []
    for piece in col.pieces:
        units = piece.heads if use_heads else piece.width
        pw = math.gcd(units, ways)
        if pw < ways and gqa == "replicate":
            notes.append(
                f"layer {layer} {kind}: part {piece.tensor!r} of {col.node} has {units} {what} "
                f"(GQA), fewer than {ways} shards; left replicated"
            )
            continue
        if pw == 1:
            continue
        split.append(piece.tensor)
        out.append(Assignment(piece.node, replicated_spec(piece.source, n), role))
        out.append(Assignment(piece.node, replicated_spec(piece.tensor, n), role))
        for index in graph.consumers.get(piece.tensor, []):
            reader = graph.nodes[index].name
            out.append(Assignment(reader, split_spec(piece.tensor, -1, pw, n), role))
    notes.append(
        f"layer {layer} {kind}: {col.node} is cut into unequal parts "
        f"{[p.width for p in col.pieces]}; no split of its weight gives every device matching "
        f"parts, so it stays replicated and {split} are split by their readers"
    )
    return out


def attention_specs(
    col: Linear, ways: int, n: int, layer: int, kind: str, notes: list[str]
) -> list[Assignment]:
    """A packed q|k|v projection and the GroupQueryAttention it feeds, split by heads.

    The attention output is split ``ways`` ways by query heads; past and present key/value ``gcd(kv_heads,
    ways)`` ways on their kv-head axis 1, each kv head on the devices whose query heads read it
    (`split_spec`'s consecutive groups). With as many kv heads as query heads the projection is split through
    the fused axis ``[{3, 1}, {N/3, ways}]``; otherwise it stays whole and every device cuts its heads out of
    it locally (a note says why).
    """
    att = col.attention
    kv_ways = math.gcd(att.kv_heads, ways)
    role, where = f"L{layer} {kind}", f"layer {layer} {kind}"
    out: list[Assignment] = []
    if col.uneven:
        notes.append(
            f"{where}: {col.node} packs q|k|v of {att.heads}|{att.kv_heads}|{att.kv_heads} heads for "
            f"{att.node}; a fused axis is a product of sub-axes and cuts every part at the same relative "
            "place, so no split of the packed weight gives each device the kv heads its query heads read: "
            "the projection stays whole (replicated) and each device takes its heads from it locally"
        )
        query = replicated_spec(att.query, n)
    else:
        out += column_specs(col, ways, n, role + " column")
        query = split_spec(att.query, -1, ways, n, 3, col.out_features)
    if kv_ways < ways:
        how = (
            "whole on every device" if kv_ways == 1
            else f"split {kv_ways} ways, each kv head on the {n // kv_ways} devices whose query heads read it"
        )
        notes.append(f"{where}: {att.node} has {att.kv_heads} kv heads for {ways} shards: its cache is {how}")
    gqa = role + " (GroupQueryAttention)"
    out.append(Assignment(att.node, query, gqa))
    out.append(Assignment(att.node, split_spec(att.output, -1, ways, n), gqa))
    for tensor in (*att.past, *att.present):
        if tensor:
            out.append(Assignment(att.node, split_spec(tensor, 1, kv_ways, n), gqa))
    return out
