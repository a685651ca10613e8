"""``onnx2jax check`` and ``onnx2jax explain``: a model's sharding annotations, checked and completed.

Examples::

    onnx2jax check model.onnx                       # exit 0 (valid) or 1 (errors), a table
    onnx2jax check model.onnx --json                # the same, for machines
    onnx2jax explain model.onnx --tensor logits     # every node: written vs inferred specs
    onnx2jax explain model.onnx --write full.onnx   # write the completed annotations
    onnx2jax explain model.onnx --plot tiles.png    # draw tiles per device and collectives per layer

Both run proposal 0007's checker and inference (`sharding.check`,
`sharding.infer`). Symbolic input dims can be fixed with ``--input-shape
input_ids=2,16`` where a rule needs sizes (a Reshape that splits a sharded
axis, say) or to draw a tensor's tiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence

import onnx

from onnx2jax.cli.errors import CliError, UsageError, check_writable, require_matplotlib
from onnx2jax.loading import load_model
from sharding.check import check_and_infer, merge
from sharding.diagnostics import Diagnostic
from sharding.infer import Inference, completed_model, reshard_note_kind
from sharding.rules.core import sharded_dims
from sharding.text import format_spec
from sharding.tiles import tile_assignment
from sharding.validate import validate_model
from sharding.visualize import render_tiles

_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an .onnx file")
    parser.add_argument("--configuration", default=None, help="device configuration (default: the first)")
    parser.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME=D0,D1,...",
        help="concrete dims of a model input (repeatable)",
    )
    parser.add_argument(
        "--strict", action="store_true", help="annotated ops without a sharding rule are errors"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_check_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``check`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "check",
        help="check a model's sharding annotations (exit 1 on errors)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser)
    parser.add_argument("--notes", action="store_true", help="list notes too (reshards, collectives)")
    parser.set_defaults(func=cmd_check)
    return parser


def add_explain_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``explain`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "explain",
        help="every node's written vs inferred sharding specs, reshards and tile grids",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(parser)
    parser.add_argument("--tensor", action="append", default=[], metavar="NAME",
                        help="draw where the pieces of this tensor live (repeatable)")
    parser.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="list only this node (repeatable)")
    parser.add_argument("--placed", action="store_true",
                        help="list only nodes with specs (by default every node is listed)")
    parser.add_argument("--write", metavar="OUT.onnx", help="write the model with every inferred spec")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="draw each tensor's tiles over the devices and the collectives per layer "
                             "(needs matplotlib: pip install 'onnx2jax[plot]')")
    parser.set_defaults(func=cmd_explain)
    return parser


def _input_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    shapes = {}
    for item in items:
        name, sep, dims = item.partition("=")
        try:
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            sep = ""
        if not sep or not name:
            raise UsageError(f"--input-shape expects NAME=D0,D1,..., got {item!r}")
    return shapes


def _require_names(model: onnx.ModelProto, shapes: dict, nodes: Sequence[str] = (), tensors: Sequence[str] = ()) -> None:
    """Names given on the command line must exist in the model: a typo is a usage error, not an empty answer."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    for name in shapes:
        if name not in inputs:
            raise UsageError(f"--input-shape {name}: the model has no input {name!r}; its inputs: {', '.join(inputs)}")
    node_names = {n.name or f"{n.op_type}#{i}" for i, n in enumerate(graph.node)}
    for name in nodes:
        if name not in node_names:
            raise UsageError(f"--node {name}: no node of that name in the model")
    values = initializers | set(inputs) | {o for n in graph.node for o in n.output}
    for name in tensors:
        if name not in values:
            raise UsageError(f"--tensor {name}: no tensor of that name in the model")


def _require_annotations(model: onnx.ModelProto, path: str) -> None:
    """A model without a device configuration has nothing to check or explain."""
    if not len(model.configuration) and not any(n.device_configurations for n in model.graph.node):
        raise CliError(
            f"{path} has no sharding annotations (no device configuration): nothing to check; "
            f"annotate it first (onnx2jax annotate {path} --plan megatron --devices N -o out.onnx)"
        )


def _console():
    from onnx2jax.cli.console import make_console

    return make_console()


def _load(path: str) -> onnx.ModelProto:
    return load_model(path, inline=False)  # a ModelLoadError names the file; onnx2jax.cli.app prints it


def _counts(diags: Sequence[Diagnostic]) -> dict[str, int]:
    return {s: sum(d.severity == s for d in diags) for s in ("error", "warning", "note")}


def diagnostics_table(diags: Sequence[Diagnostic], title: str | None = None):
    """A rich table with one row per diagnostic."""
    from rich.table import Table

    table = Table(title=title, show_lines=True, title_justify="left", expand=True)
    for column in ("severity", "code", "axis"):
        table.add_column(column, no_wrap=True, ratio=None)
    nodes = ["" if d.node is None else f"{d.node} ({d.op_type})" if d.op_type else d.node for d in diags]
    table.add_column("node", overflow="fold", min_width=min(24, max(map(len, nodes), default=4)))
    table.add_column("tensor", overflow="fold", min_width=min(16, max((len(d.tensor or "") for d in diags), default=6)))
    table.add_column("found", overflow="fold", ratio=5)
    hints = any(d.hint for d in diags)
    if hints:
        table.add_column("hint", overflow="fold", ratio=3)
    for d, node in zip(diags, nodes, strict=True):
        cells = [
            f"[{_STYLE[d.severity]}]{d.severity}[/]",
            d.code,
            "" if d.axis is None else str(d.axis),
            node,
            d.tensor or "",
            d.message,
        ]
        table.add_row(*cells, *([d.hint or ""] if hints else []))
    return table


def _summary(counts: dict[str, int]) -> str:
    if counts["error"]:
        head = f"[bold red]{counts['error']} error(s)[/]"
    else:
        head = "[bold green]no errors[/]"
    return f"{head}, {counts['warning']} warning(s), {counts['note']} note(s)"


def _print_stages(console, diags: Sequence[Diagnostic]) -> None:
    """One line per pipeline stage (nodes, devices, what it sends), for a staged model."""
    for d in diags:
        if d.code == "pipeline-stage":
            console.print(d.message, markup=False)


def cmd_check(args: argparse.Namespace) -> int:
    """Checks the annotations; prints a table or JSON; exit status 1 when there are errors."""
    model = _load(args.model)
    _require_names(model, _input_shapes(args.input_shape))
    _require_annotations(model, args.model)
    diags, _, _ = _checked(model, args.configuration, _input_shapes(args.input_shape), args.strict)
    counts = _counts(diags)
    if args.json:
        print(json.dumps({
            "model": args.model,
            "valid": counts["error"] == 0,
            "counts": counts,
            "diagnostics": [dataclasses.asdict(d) for d in diags],
        }, indent=2))
    else:
        console = _console()
        shown = [d for d in diags if args.notes or d.severity != "note"]
        if shown:
            console.print(diagnostics_table(shown, f"{args.model}: sharding annotations"))
        _print_stages(console, diags)
        hidden = "" if args.notes or not counts["note"] else " (--notes lists the notes)"
        console.print(_summary(counts) + hidden)
    return 1 if counts["error"] else 0


def _rows(inference: Inference, model: onnx.ModelProto, everything: bool, only: set[str] = frozenset()):
    """(node, op, role, tensor, written, inferred, reshard) per placed input/output."""
    reshards = {(d.node, d.tensor): d for d in inference.diagnostics if d.code == "reshard"}
    by_name = {n.name or f"{n.op_type}#{i}": n for i, n in enumerate(model.graph.node)}
    for key, found in inference.nodes.items():
        if only and key not in only:
            continue
        proto = by_name[key]
        specs = list(found.inputs) + list(found.outputs)
        if all(s is None for s in specs):
            if everything:
                yield (key, found.op_type, "", "", "", "unplaced", "")
            continue
        first = True
        for role, names, values, given in (
            ("in", proto.input, found.inputs, found.given_inputs),
            ("out", proto.output, found.outputs, found.given_outputs),
        ):
            for name, spec, written in zip(names, values, given, strict=False):
                if not name:
                    continue
                note = reshards.get((proto.name, name))
                text = "" if spec is None else format_spec(spec)
                if written:
                    inferred = note.expected if note is not None else text
                    row_given = text
                else:
                    inferred, row_given = text, ""
                kind = ""
                if note is not None:
                    kind = reshard_note_kind(note)
                yield (key if first else "", found.op_type if first else "", role, name,
                       row_given, inferred, kind)
                first = False


def _grid(inference: Inference, name: str, shapes: dict) -> str:
    spec = inference.tensors.get(name)
    if spec is None:
        return f"{name}: no spec (not on the sharded path, or not a tensor of the model)"
    shape = list(inference.shapes.get(name) or ())
    if not shape and name not in inference.shapes:
        return f"{name}: {format_spec(spec)} (shape unknown; pass --input-shape)"
    cut = {axis for axis, _ in sharded_dims(spec, len(shape))}
    concrete = []
    for axis, dim in enumerate(shape):
        if isinstance(dim, int):
            concrete.append(dim)
        elif axis not in cut:
            concrete.append(1)  # an unsharded symbolic axis draws as one block
        else:
            return f"{name}: {format_spec(spec)} (axis {axis} is {dim!r}; pass --input-shape)"
    head = f"{name} {shape}: {format_spec(spec)}"
    if len(concrete) <= 2:
        return head + "\n" + render_tiles(spec, concrete)
    grid = tile_assignment(spec, concrete)
    axes = [a for a in range(grid.ndim) if grid.shape[a] > 1]
    lines = [head, f"blocks per axis: {list(grid.shape)}"]
    if len(axes) <= 2:
        # Draw the block grid of the (at most two) cut axes: rows = first, columns = second.
        cells = grid.reshape([grid.shape[a] for a in axes] or [1])
        if cells.ndim == 1:
            cells = cells.reshape(1, -1)
        labels = [[",".join(map(str, d)) for d in row] for row in cells.tolist()]
        lines.append(f"rows: {'axis ' + str(axes[0]) if len(axes) == 2 else 'whole'}; "
                     f"columns: {'axis ' + str(axes[-1]) if axes else 'whole'}")
        lines += _boxes(labels)
        return "\n".join(lines)
    for index, devices in zip(_indices(grid.shape), grid.ravel(), strict=True):
        block = ", ".join(f"axis {a} block {index[a]}" for a in axes)
        lines.append(f"  {block}: devices {{{','.join(map(str, devices))}}}")
    return "\n".join(lines)


def _boxes(rows: list[list[str]]) -> list[str]:
    """Box-drawing grid of labels (as `sharding.visualize.render_tiles` draws)."""
    width = max(len(x) for row in rows for x in row) + 2
    bar = "─" * width
    n = len(rows[0])
    out = ["┌" + "┬".join([bar] * n) + "┐"]
    for i, row in enumerate(rows):
        out.append("│" + "│".join(x.center(width) for x in row) + "│")
        out.append(("├" + "┼".join([bar] * n) + "┤") if i < len(rows) - 1 else ("└" + "┴".join([bar] * n) + "┘"))
    return out


def _indices(shape):
    import itertools

    return itertools.product(*(range(n) for n in shape))


def _plot(path: str, model: onnx.ModelProto, inference: Inference, out: str, *, quiet: bool) -> None:
    from onnx2jax.tile_plot import render
    from sharding.tile_map import tile_map

    tiles = tile_map(model, inference)
    drawn = tiles.tensors()
    if not drawn:
        raise CliError(f"{path}: no tensor carries a spec with a known shape; nothing to draw (pass --input-shape)")
    title = (f"{os.path.basename(path)}: configuration {tiles.configuration!r}, {tiles.num_devices} devices; "
             f"collectives {tiles.collectives_source}")
    render(tiles, out, title=title)
    if not quiet:
        split = sum(not t.replicated for t in drawn)
        _console().print(f"wrote {out}: {len(drawn)} tensors ({split} split) in {len(tiles.layers)} layers", markup=False)


def _checked(model: onnx.ModelProto, configuration: str | None, shapes: dict, strict: bool):
    """(diagnostics, inference, segments) as compile() sees the model.

    A segmented model (data-dependent output shapes) is inferred one jitted
    segment at a time, as compile() runs it; segments is None otherwise.
    """
    unsupported = "error" if strict else "warning"
    diagnostics, inference = check_and_infer(model, configuration, input_shapes=shapes, unsupported=unsupported)
    sharded = _segments(model, inference.configuration, shapes, unsupported)
    if sharded is not None:
        from sharding.segment_sharding import merged_inference

        inference = merged_inference(sharded, inference.configuration)
        diagnostics = merge(validate_model(model, input_shapes=shapes), inference.diagnostics)
    return diagnostics, inference, sharded


def _segments(model: onnx.ModelProto, configuration: str | None, shapes: dict, unsupported: str):
    """A segmented model's jitted segments, annotated and inferred as compile() does; None if it is one program."""
    from sharding import segments

    cuts = segments.data_dependent_nodes(model)
    if not cuts or configuration is None:
        return None
    from sharding.segment_sharding import shard_segments

    return shard_segments(segments.plan(model, cuts), configuration, input_shapes=shapes, unsupported=unsupported)


def _segment_lines(sharded) -> list[str]:
    if sharded is None:
        return []
    from sharding.segment_sharding import describe

    head = (
        f"runs in {len(sharded.segments)} segments (data-dependent output shapes): each jitted segment is "
        "its own SPMD program on one mesh; a host step gathers its inputs, the next segment re-places its outputs "
        "(a tensor received from an earlier jitted segment has its producer's spec written on its readers)"
    )
    return [head] + [f"  {line}" for line in describe(sharded)]


def cmd_explain(args: argparse.Namespace) -> int:
    """Lists every placed node's written vs inferred specs and reshards; draws named tensors."""
    if args.plot:
        check_writable("--plot", args.plot, ".png")
        require_matplotlib()
    model = _load(args.model)
    shapes = _input_shapes(args.input_shape)
    _require_names(model, shapes, args.node, args.tensor)
    _require_annotations(model, args.model)
    diagnostics, inference, sharded = _checked(model, args.configuration, shapes, args.strict)
    rows = list(_rows(inference, model, not args.placed, set(args.node)))
    problems = [
        d for d in diagnostics
        if (d.severity != "note" or d.code == "collective") and (not args.node or d.node in args.node)
    ]
    if args.json:
        print(json.dumps({
            "model": args.model,
            "configuration": inference.configuration,
            "nodes": [dict(zip(("node", "op_type", "role", "tensor", "given", "inferred", "reshard"), r, strict=True))
                      for r in rows],
            "diagnostics": [dataclasses.asdict(d) for d in diagnostics],
            "tiles": {name: _grid(inference, name, shapes) for name in args.tensor},
            "segments": _segment_lines(sharded),
        }, indent=2))
    else:
        from rich.table import Table

        console = _console()
        table = Table(title=f"{args.model}: configuration {inference.configuration!r}", title_justify="left")
        widest = lambda i, cap: min(cap, max((len(r[i]) for r in rows), default=4))  # noqa: E731
        table.add_column("node", overflow="fold", min_width=widest(0, 16))
        table.add_column("op", no_wrap=True)
        table.add_column("", no_wrap=True)
        table.add_column("tensor", overflow="fold", min_width=widest(3, 12))
        table.add_column("written", overflow="fold", ratio=1)
        table.add_column("inferred", overflow="fold", ratio=1)
        table.add_column("reshard", no_wrap=True)
        for row in rows:
            table.add_row(*row)
        console.print(table)
        if problems:
            console.print(diagnostics_table(problems, "diagnostics (notes: collectives only)"))
        for name in args.tensor:
            console.print(_grid(inference, name, shapes), markup=False)
        _print_stages(console, inference.diagnostics)
        for line in _segment_lines(sharded):
            console.print(line, markup=False)
        console.print(_summary(_counts(diagnostics)))
    if args.write:
        onnx.save(completed_model(model, inference), args.write)
        if not args.json:
            _console().print(f"wrote {args.write}")
    if args.plot:
        _plot(args.model, model, inference, args.plot, quiet=args.json)
    return 1 if any(d.severity == "error" for d in diagnostics) else 0
