"""Column/row pairs of the Megatron plan: how many ways each pair is split, and its specs.

Shard count ``w`` per pair: the largest divisor of ``num_devices`` that
divides the heads (attention; heads read from the Reshape that splits the
projection) or the width (MLP). GQA: key/value projections with fewer heads
than ``w`` are left replicated by default; with ``gqa="groups"`` they are
split ``gcd(kv_heads, w)`` ways on groups, so that device d holds exactly the
kv head its query heads read. A column cut into unequal parts stays
replicated and its parts are split by their readers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding.megatron.graph import PlanGraph
from sharding.megatron.linears import Linear
from sharding.megatron.specs import Assignment, attention_specs, column_specs, piece_specs, row_specs


@dataclass(frozen=True)
class LinearPair:
    """Column-parallel linears feeding one row-parallel linear.

    Attributes:
        kind: ``"attention"`` or ``"mlp"``.
        layer: Index of the transformer block (attention pairs open a block).
        columns: Names of the column-parallel linears, in graph order.
        row: Name of the row-parallel linear.
        ways: Shards of the pair's sharded axis (heads or width); 1 when
            the pair is left replicated.
        column_ways: Per column, its shard count (fewer for GQA's k/v; 1
            when left replicated).
    """

    kind: str
    layer: int
    columns: tuple[str, ...]
    row: str
    ways: int
    column_ways: tuple[int, ...]



def _col_heads(col: Linear) -> bool:
    if col.attention is not None:
        return True
    if col.uneven:
        return bool(col.pieces) and all(p.heads for p in col.pieces)
    return bool(col.heads)


def _col_units(col: Linear, use_heads: bool) -> int:
    """What a shard of the column must hold whole, for its largest part."""
    if col.attention is not None:
        return col.attention.heads if use_heads else col.out_features
    if col.uneven:
        return max((p.heads if use_heads else p.width) for p in col.pieces) if col.pieces else 1
    return col.heads if use_heads else col.out_features // col.parts


def pair_assignments(
    graph: PlanGraph,
    linears: dict[int, Linear],
    raw_pairs: list[tuple[list[int], int, bool]],
    n: int,
    gqa: str,
    notes: list[str],
) -> tuple[list[LinearPair], list[Assignment]]:
    """The pairs (numbered by transformer block: an attention pair opens one) and their specs.

    Args:
        raw_pairs: ``(column indices, row index, crossed attention)`` from `pair_linears`.
        n: Devices of the tensor-parallel group.
        gqa: ``"replicate"`` or ``"groups"``; see `sharding.megatron.megatron_layout`.
        notes: Choices worth telling a user are appended here.
    """
    assignments: list[Assignment] = []
    pairs: list[LinearPair] = []
    layer, previous = -1, None
    for sources, index, attention in raw_pairs:
        kind = "attention" if attention else "mlp"
        if kind == "attention" or previous != "attention":
            layer += 1
        previous = kind
        cols = [linears[s] for s in sources]
        row = linears[index]
        use_heads = attention and all(_col_heads(c) for c in cols)
        units = [_col_units(c, use_heads) for c in cols]
        ways = math.gcd(max(units), n)
        if row.blocks and ways > 1 and row.blocks % ways:
            fewer = math.gcd(ways, row.blocks)
            notes.append(
                f"layer {layer} {kind}: {row.node} is quantized in {row.blocks} blocks along K, and a row "
                f"split cuts whole blocks: {fewer} ways instead of {ways}"
            )
            ways = fewer
        col_ways = [math.gcd(u, ways) for u in units]
        what = "heads" if use_heads else "features"
        unknown = [c.node for c in cols if c.uneven and c.attention is None and not (c.pieces and use_heads)]
        if unknown:
            ways, col_ways = 1, [1] * len(cols)
            notes.append(
                f"layer {layer} {kind} ({row.node}): {unknown} split their output into unequal "
                "parts of unknown sizes or heads (no fused axis describes that); left replicated"
            )
        elif ways == 1 or row.in_features % ways:
            ways, col_ways = 1, [1] * len(cols)
            if n > 1:
                notes.append(
                    f"layer {layer} {kind} ({row.node}): {what} {units} share no divisor "
                    f"with {n} devices; left replicated"
                )
        else:
            if ways < n:
                notes.append(
                    f"layer {layer} {kind}: {what} {max(units)} split {ways} ways, each shard "
                    f"on {n // ways} devices ({max(units)} {what} do not divide by {n}; {ways} is the "
                    f"largest count dividing both, so each shard is replicated on {n // ways} devices, "
                    "which a data-parallel axis of that size could use instead)"
                )
            for position, (col, cw, u) in enumerate(zip(cols, col_ways, units)):
                if col.attention is not None:
                    col_ways[position] = ways if not col.uneven else 1
                    assignments += attention_specs(col, ways, n, layer, kind, notes)
                    continue
                if col.uneven:
                    col_ways[position] = 1
                    assignments += piece_specs(graph, col, ways, n, use_heads, gqa, layer, kind, notes)
                    continue
                if cw < ways and gqa == "replicate":
                    col_ways[position] = 1
                    notes.append(
                        f"layer {layer} {kind}: {col.node} has {u} {what} (GQA), fewer than "
                        f"{ways} shards; left replicated (gqa='groups' splits it {cw} ways)"
                    )
                    continue
                if cw < ways:
                    notes.append(
                        f"layer {layer} {kind}: {col.node} has {u} {what} (GQA); split {cw} "
                        f"ways, each shard on the {n // cw} devices whose query heads read it"
                    )
                assignments += column_specs(col, cw, n, f"L{layer} {kind} column")
            assignments += row_specs(row, ways, n, f"L{layer} {kind} row")
        pairs.append(
            LinearPair(kind, layer, tuple(c.node for c in cols), row.node, ways, tuple(col_ways))
        )
    return pairs, assignments
