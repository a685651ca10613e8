"""``onnx2jax explain``: every node's written vs inferred sharding specs, reshards and tile grids.

Examples::

    onnx2jax explain model.onnx --tensor logits     # every node: written vs inferred specs
    onnx2jax explain model.onnx --write full.onnx   # write the completed annotations
    onnx2jax explain model.onnx --plot tiles.png    # draw tiles per device and collectives per layer
    onnx2jax explain model.onnx --auto --devices 8 --batch 4   # the automatic plan's top candidates, then its winner

It runs proposal 0007's checker and inference (`sharding.check`,
`sharding.infer`) as ``onnx2jax check`` does. Symbolic input dims can be fixed
with ``--input-shape input_ids=2,16`` where a rule needs sizes (a Reshape that
splits a sharded axis, say) or to draw a tensor's tiles. A model with
pipeline stages is inferred stage by stage; its summary (and ``--json``'s
``stages``) counts each stage, then the sums.

``--auto`` runs the search of ``annotate --auto`` (`onnx2jax.cli.annotate_auto`,
docs/auto-plans.md) and writes no file: it prints the top candidates with
their predicted cost and the hand plan's, and, where JAX sees the devices,
the winner compiled and its measured collectives and bytes against the
prediction (``--json``: ``auto``); then it explains the winner's
annotations (configuration ``auto``) as above.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os

import onnx
from rich.table import Table

from onnx2jax.cli.check import (
    add_common_arguments,
    checked,
    configuration_line,
    diagnostics_table,
    load,
    parse_input_shapes,
    print_stages,
    require_annotations,
    require_names,
    severity_counts,
    summary_line,
    target_summary,
)
from onnx2jax.cli import annotate_auto
from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError, check_writable, require_matplotlib
from onnx2jax.cli.options import add_verbose_argument
from onnx2jax.errors import ModelLoadError
from onnx2jax.saving import save_model
from onnx2jax.tile_plot import render
from sharding import codes
from sharding.infer import Inference, completed_model, reshard_note_kind
from sharding.partition import Partition
from sharding.rules.views import sharded_dims
from sharding.segment_sharding import describe
from sharding.stages import has_stages, model_partition
from sharding.text import format_spec
from sharding.tile_map import tile_map
from sharding.tiles import tile_assignment
from sharding.visualize import render_tiles


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``explain`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "explain",
        help="every node's written vs inferred sharding specs, reshards and tile grids",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser)
    parser.add_argument("--tensor", action="append", default=[], metavar="NAME",
                        help="draw where the pieces of this tensor live (repeatable)")
    parser.add_argument("--node", action="append", default=[], metavar="NAME",
                        help="list only this node (repeatable)")
    parser.add_argument("--placed", action="store_true",
                        help="list the nodes with specs only (with --verbose every node is listed)")
    parser.add_argument("--write", metavar="OUT.onnx", help="write the model with every inferred spec")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="draw each tensor's tiles over the devices and the collectives per layer "
                             "(needs matplotlib: pip install matplotlib)")
    add_verbose_argument(parser, "the table of every node's written and inferred specs (also printed with "
                                 "--node or --placed) and every collective note")
    annotate_auto.add_arguments(parser, devices=True)
    return parser


def _rows(inference: Inference, model: onnx.ModelProto, everything: bool, only: set[str] = frozenset()):
    """(node, op, role, tensor, written, inferred, reshard) per placed input/output."""
    reshards = {(d.node, d.tensor): d for d in inference.diagnostics if d.code == codes.RESHARD}
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
    return itertools.product(*(range(n) for n in shape))


def _plot(path: str, model: onnx.ModelProto, inference: Inference, out: str, *, quiet: bool) -> None:
    tiles = tile_map(model, inference)
    drawn = tiles.tensors()
    if not drawn:
        raise CliError(f"{path}: no tensor carries a spec with a known shape; nothing to draw (pass --input-shape)")
    title = (f"{os.path.basename(path)}: configuration {tiles.configuration!r}, {tiles.num_devices} devices; "
             f"collectives {tiles.collectives_source}")
    render(tiles, out, title=title)
    if not quiet:
        split = sum(not t.replicated for t in drawn)
        terminal.make_console().print(f"wrote {out}: {len(drawn)} tensors ({split} split) in {len(tiles.layers)} layers", markup=False)


def _segment_lines(sharded) -> list[str]:
    if sharded is None:
        return []
    head = (
        f"runs in {len(sharded.segments)} segments (data-dependent output shapes): each jitted segment is "
        "its own SPMD program on one mesh; a host step gathers its inputs, the next segment re-places its outputs "
        "(a tensor received from an earlier jitted segment has its producer's spec written on its readers)"
    )
    return [head] + [f"  {line}" for line in describe(sharded)]


def run(args: argparse.Namespace) -> int:
    """Lists every placed node's written vs inferred specs and reshards; draws named tensors."""
    if args.plot:
        check_writable("--plot", args.plot, ".png")
        require_matplotlib()
    model = load(args.model)
    shapes = parse_input_shapes(args.input_shape)
    auto = None
    annotate_auto.require_auto(args, devices=True)
    if args.auto:
        if args.configuration is not None:
            raise UsageError("--auto explains the plan it finds (configuration 'auto'): it goes without --configuration")
        model, report, notes = annotate_auto.search(args, model)
        args.configuration, auto = "auto", (report, notes)
    require_names(model, shapes, args.node, args.tensor)
    require_annotations(model, args.model)
    with terminal.make_console(stderr=True).status(f"checking and inferring {args.model} ..."):  # terminals only
        diagnostics, inference, sharded = checked(model, args.configuration, shapes, args.strict)
    # --target: the model's own plan compiled for it (with --auto, search compiled its winner for it already)
    compiled = None if args.auto else target_summary(args, args.model, args.configuration)
    rows = list(_rows(inference, model, not args.placed, set(args.node)))
    part = _partition(model, inference.configuration)
    # Per-stage counts are over the whole model, whatever --node/--placed list.
    stages = None if part is None else _stage_counts(list(_rows(inference, model, True)), diagnostics, part)
    problems = [
        d for d in diagnostics
        if (d.severity != "note" or d.code == codes.COLLECTIVE) and (not args.node or d.node in args.node)
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
            **({} if stages is None else {"stages": stages}),
            **({} if auto is None else {"auto": {**auto[0].as_dict(), "run_notes": auto[1]}}),
            **({} if compiled is None else {"target": {k: v for k, v in compiled.items() if k != "lines"}}),
        }, indent=2))
    else:
        console = terminal.make_console()
        for line in [] if auto is None else [f"note: {n}" for n in auto[1]] + auto[0].lines():
            console.print(line, markup=False)
        listed = args.verbose or args.node or args.placed
        if not listed:
            _summary(console, rows, inference, problems, stages)
        else:
            _print_rows(console, rows, args.model, inference, problems)
        for name in args.tensor:
            console.print(_grid(inference, name, shapes), markup=False)
        print_stages(console, inference.diagnostics)
        for line in _segment_lines(sharded):
            console.print(line, markup=False)
        which = configuration_line(model, args.configuration)
        if which:
            console.print(which.replace("checked", "explained", 1), markup=False)
        for line in [] if compiled is None else compiled["lines"]:
            console.print(line, markup=False)
        console.print(summary_line(severity_counts(diagnostics)) + ("" if listed else " (--verbose lists every node)"))
    if args.write:
        # The weights stay in the source's external data (a small .onnx beside it); see onnx2jax.saving.
        try:
            save_model(completed_model(model, inference), args.write, os.path.dirname(os.path.abspath(args.model)))
        except ModelLoadError as e:
            raise CliError(f"not written: {e}") from None
        if not args.json:
            terminal.make_console().print(f"wrote {args.write}")
    if args.plot:
        _plot(args.model, model, inference, args.plot, quiet=args.json)
    return 1 if any(d.severity == "error" for d in diagnostics) else 0


def _counts(rows: list) -> dict[str, int]:
    """Nodes placed, specs written, specs inferred and reshards among ``rows`` (as `_rows` yields them)."""
    return {
        "placed": sum(1 for r in rows if r[0] and r[5] != "unplaced"),
        "written": sum(1 for r in rows if r[4]),
        "inferred": sum(1 for r in rows if r[5] and r[5] != "unplaced" and not r[4]),
        "reshards": sum(1 for r in rows if r[6]),
    }


def _partition(model: onnx.ModelProto, configuration: str | None) -> Partition | None:
    """The model's pipeline stages for ``configuration``; None if it has none (or invalid ones: a diagnostic says why)."""
    if configuration is None or not has_stages(model, configuration):
        return None
    try:
        return model_partition(model, configuration)
    except ValueError:
        return None


def _stage_counts(rows: list, diagnostics: list, part: Partition) -> list[dict]:
    """Per pipeline stage: its nodes, then `_counts` of its rows and the collectives noted at its nodes.

    ``rows`` are every node's (`_rows` with ``everything``): a node's later rows
    have no node name, so each row belongs to the last name above it.
    """
    by_stage: dict = {}
    node = None
    for r in rows:
        node = r[0] or node
        by_stage.setdefault(part.part_of.get(node), []).append(r)
    collectives = [part.part_of.get(d.node) for d in diagnostics if d.code == codes.COLLECTIVE]
    return [
        {"stage": stage, "nodes": len(part.nodes[stage]), **_counts(by_stage.get(stage, [])),
         "collectives": collectives.count(stage)}
        for stage in part.parts
    ]


def _summary(console, rows: list, inference: Inference, problems: list, stages: list | None) -> None:
    """The short form: specs written, inferred and resharded (in all, then per stage); problems; collectives."""
    total = _counts(rows)
    head = f"configuration {inference.configuration!r}"
    if stages:
        head += f", {len(stages)} pipeline stages"
    console.print(f"{head}: {total['placed']} nodes placed, {total['written']} specs written, "
                  f"{total['inferred']} inferred, {total['reshards']} reshard(s)" + (" in all" if stages else ""),
                  markup=False)
    for s in stages or ():
        console.print(f"  stage {s['stage']}: {s['placed']} of its {s['nodes']} nodes placed, {s['written']} specs "
                      f"written, {s['inferred']} inferred, {s['reshards']} reshard(s), "
                      f"{s['collectives']} collective(s)", markup=False)
    reshards = [r for r in rows if r[6]]
    for r in reshards:
        console.print(f"  reshard ({r[6]}) of {r[3]!r} at {r[0] or 'the node above'}: written {r[4]}, "
                      f"inferred {r[5]}", markup=False)
    serious = [d for d in problems if d.severity != "note"]
    if serious:
        console.print(diagnostics_table(serious, "diagnostics"))
    collectives = [d for d in problems if d.code == codes.COLLECTIVE]
    if collectives:
        where = ", ".join(dict.fromkeys(d.node or "?" for d in collectives))
        console.print(f"collectives the specs imply: {len(collectives)}, at {where}", markup=False)


def _print_rows(console, rows: list, path: str, inference: Inference, problems: list) -> None:
    """The long form: every listed node's written and inferred specs, then the diagnostics table."""
    table = Table(title=f"{path}: configuration {inference.configuration!r}", title_justify="left")
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
