"""Draws a `sharding.tile_map.TileMap` with matplotlib (the ``plot`` extra): ``onnx2jax explain --plot``.

Only drawing happens here; what to draw comes from `sharding.tile_map`.
Left: one row per tensor, one column per device; a cell is the block that
device holds (one colour per block of that tensor, its index ranges written
in the cell), grey with "all" when the tensor is replicated, blank when the
device holds none of it. Rows are grouped by layer, about ``max_rows`` in
all (split weights first, `sharding.tile_map.select`) with a "+N more" row
for the rest. Right: the collectives of each layer, by kind, and where.
"""

from __future__ import annotations

import os

from sharding.tile_map import Shown, TileMap, collective_counts, describe, select

_ROW = 0.3  # inches per row
_REPLICATED = "#d9d9d9"


def _rows(shown: list[Shown], left_out: list) -> list[tuple[str, object]]:
    """The figure's rows, top to bottom: ("layer", name), ("tensor", TensorTiles), ("more", text)."""
    rows: list[tuple[str, object]] = []
    for item in shown:
        rows.append(("layer", item.layer.name))
        rows += [("tensor", t) for t in item.tensors]
        if item.more:
            rows.append(("more", f"+{item.more} more ({item.more_split} split, {item.more_replicated} replicated)"))
        if item.layer.unplaced:
            names = ", ".join(u.name for u in item.layer.unplaced[:3])
            extra = f" +{len(item.layer.unplaced) - 3}" if len(item.layer.unplaced) > 3 else ""
            rows.append(("more", f"{len(item.layer.unplaced)} not drawn (shape unknown: pass --input-shape): {names}{extra}"))
    if left_out:
        count = sum(len(layer.tensors) + len(layer.unplaced) for layer in left_out)
        rows.append(("more", f"+{len(left_out)} more layers ({count} tensors, "
                             f"{sum(len(layer.collectives) for layer in left_out)} collectives)"))
    return rows


def render(tiles: TileMap, path: str | os.PathLike, *, title: str, max_rows: int = 60, max_layers: int = 12) -> None:
    """Writes the figure of ``tiles`` to ``path`` (the format from its suffix, PNG usually).

    Raises:
        ImportError: matplotlib is not installed (the ``plot`` extra).
    """
    import matplotlib  # the optional ``plot`` extra, loaded only to draw

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    shown, left_out = select(tiles, max_rows=max_rows, max_layers=max_layers)
    rows = _rows(shown, left_out)
    n = tiles.num_devices
    height = max(3.0, _ROW * (len(rows) + 4))
    fig, (grid, bars) = plt.subplots(
        1, 2, figsize=(min(24.0, 7.0 + 0.7 * n), height), gridspec_kw={"width_ratios": [max(n, 4), 3]}
    )
    palette = plt.get_cmap("tab20").colors
    labels = n <= 16
    # Row labels are y tick labels, so that tight_layout makes room for them.
    row_labels, row_styles = [], []
    for y, (kind, item) in enumerate(rows):
        if kind == "layer":
            row_labels.append(item)
            row_styles.append({"fontsize": 9, "fontweight": "bold"})
            grid.axhline(y - 0.5, color="black", lw=0.8)
            continue
        if kind == "more":
            row_labels.append(item)
            row_styles.append({"fontsize": 8, "style": "italic", "color": "#555555"})
            continue
        tensor = item
        name = tensor.name if len(tensor.name) <= 36 else "…" + tensor.name[-35:]
        cut = "replicated" if tensor.replicated else "cut axis " + ",".join(map(str, tensor.cut_axes))
        row_labels.append(f"{name} {list(tensor.shape)} {tensor.kind}  {cut}")
        row_styles.append({"fontsize": 7, "family": "monospace"})
        colour = {piece: palette[i % len(palette)] for i, piece in enumerate(tensor.blocks())}
        for tile in tensor.tiles:
            x = tile.device
            if not tile.pieces:
                grid.add_patch(Rectangle((x - 0.5, y - 0.45), 1, 0.9, fill=False, ec="#bbbbbb", lw=0.5))
                continue
            face = _REPLICATED if tensor.replicated else colour[tile.pieces[0]]
            grid.add_patch(Rectangle((x - 0.5, y - 0.45), 1, 0.9, fc=face, ec="white", lw=0.5))
            if labels:
                text = " ".join(describe(tensor, p) for p in tile.pieces)
                grid.text(x, y, text, ha="center", va="center", fontsize=6 if len(text) < 8 else 5)
    grid.set_xlim(-0.5, n - 0.5)
    grid.set_ylim(len(rows) - 0.5, -0.5)
    grid.set_xticks(range(n))
    grid.set_xticklabels([f"device {d}" if n <= 8 else str(d) for d in range(n)], fontsize=7)
    grid.xaxis.tick_top()
    grid.set_yticks(range(len(rows)))
    grid.set_yticklabels(row_labels)
    for label, style in zip(grid.get_yticklabels(), row_styles, strict=True):
        label.set(**style)
    grid.tick_params(axis="y", length=0)
    for side in ("left", "right", "bottom"):
        grid.spines[side].set_visible(False)

    kinds = sorted({k for item in shown for k in collective_counts(item.layer)})
    layer_y = [y for y, (kind, _) in enumerate(rows) if kind == "layer"]
    starts = [0] * len(shown)
    for i, kind_name in enumerate(kinds):
        counts = [collective_counts(item.layer).get(kind_name, 0) for item in shown]
        bars.barh(layer_y, counts, left=starts, height=0.8, color=palette[(2 * i) % len(palette)], label=kind_name)
        for y, left, count in zip(layer_y, starts, counts, strict=True):
            if count:
                bars.text(left + count / 2, y, str(count), ha="center", va="center", fontsize=7)
        starts = [s + c for s, c in zip(starts, counts, strict=True)]
    for y, item in zip(layer_y, shown, strict=True):
        where = [c.tensor or c.node or "?" for c in item.layer.collectives]
        text = "none" if not where else "at " + ", ".join(where[:4]) + (f" +{len(where) - 4}" if len(where) > 4 else "")
        bars.text(0.05, y + 0.75, text, va="center", fontsize=6, color="#555555")
    bars.set_ylim(len(rows) - 0.5, -0.5)
    bars.set_yticks([])
    bars.set_xlim(0, max(starts, default=0) + 1)
    bars.set_title(f"collectives per layer\n({tiles.collectives_source})", fontsize=9)
    if kinds:
        bars.legend(fontsize=7, loc="lower right")
    bars.set_xlabel("count", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(os.fspath(path), dpi=80, bbox_inches="tight", pad_inches=0.15)  # nothing clipped
    plt.close(fig)
