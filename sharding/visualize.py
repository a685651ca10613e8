"""Plain-text pictures of where a tensor's pieces live.

Like ``jax.debug.visualize_array_sharding``, for 0-, 1- and 2-D tensors, in
box-drawing characters. Cells are the pieces of the canonical placement (see
`ShardingSpec.canonical`), so a fused axis shows its interleaved pieces and
neighbours on the same devices merge. A cell lists its devices, e.g. ``0,1``
for a piece replicated on devices 0 and 1.
"""

from __future__ import annotations

from collections.abc import Sequence

from sharding.spec import ShardingSpec


def render_tiles(spec: ShardingSpec, shape: Sequence[int]) -> str:
    """Draws which devices hold which piece of a tensor.

    Args:
        spec: The spec.
        shape: The tensor's concrete shape, of rank 2 or less.

    Returns:
        The picture, lines joined by newlines (no trailing newline).

    Raises:
        ValueError: The rank is above 2 or the spec does not fit ``shape``.

    Example:
        >>> print(render_tiles(ShardingSpec.split("X", {0: 2, 1: 2}, [0, 1, 2, 3]), (4, 4)))
        ┌───┬───┐
        │ 0 │ 1 │
        ├───┼───┤
        │ 2 │ 3 │
        └───┴───┘
    """
    if len(shape) > 2:
        raise ValueError(f"render_tiles draws tensors of rank <= 2, got shape {tuple(shape)}")
    placement = spec.canonical(shape)
    if not placement.cells:
        return f"(no elements: shape {placement.shape})"
    num_columns = len(placement.bounds[-1]) - 1 if placement.bounds else 1
    labels = [",".join(map(str, devices)) for devices in placement.cells]
    rows = [labels[i : i + num_columns] for i in range(0, len(labels), num_columns)]
    widths = [max(len(row[j]) for row in rows) + 2 for j in range(num_columns)]

    def rule(left: str, middle: str, right: str) -> str:
        return left + middle.join("─" * w for w in widths) + right

    lines = [rule("┌", "┬", "┐")]
    for index, row in enumerate(rows):
        if index:
            lines.append(rule("├", "┼", "┤"))
        lines.append(
            "│" + "│".join(label.center(w) for label, w in zip(row, widths, strict=True)) + "│"
        )
    lines.append(rule("└", "┴", "┘"))
    return "\n".join(lines)
