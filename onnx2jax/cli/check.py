"""``onnx2jax check``: a model's sharding annotations, checked (the table and the checks ``explain`` shares).

Examples::

    onnx2jax check model.onnx                       # exit 0 (valid) or 1 (errors), a table
    onnx2jax check model.onnx --json                # the same, for machines

It runs proposal 0007's checker and inference (`sharding.check`,
`sharding.infer`). Symbolic input dims can be fixed with ``--input-shape
input_ids=2,16`` where a rule needs sizes (a Reshape that splits a sharded
axis, say) or to draw a tensor's tiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import os
from collections.abc import Sequence
from typing import Any

import onnx
from rich.table import Table

from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError
from onnx2jax.cli.options import add_target_arguments, target_of
from onnx2jax.loading import open_model
from sharding import codes, segments
from sharding.check import check_and_infer, merge
from sharding.configuration import choose_configuration
from sharding.diagnostics import Diagnostic
from sharding.segment_sharding import merged_inference, shard_segments
from sharding.validate import validate_model

_STYLE = {"error": "bold red", "warning": "yellow", "note": "cyan"}


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments ``check`` and ``explain`` share: the model, its configuration, input shapes, --strict, --json."""
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
    add_target_arguments(parser)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``check`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "check",
        help="check a model's sharding annotations (exit 1 on errors)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_arguments(parser)
    parser.add_argument("--notes", action="store_true", help="list notes too (reshards, collectives)")
    return parser


def parse_input_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """``--input-shape NAME=D0,D1,...`` items as {name: dims}."""
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


def require_names(model: onnx.ModelProto, shapes: dict, nodes: Sequence[str] = (), tensors: Sequence[str] = ()) -> None:
    """Names given on the command line must exist in the model: a typo is a usage error, not an empty answer."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    declared = {i.name: i for i in graph.input}
    for name, dims in shapes.items():
        if name not in inputs:
            raise UsageError(f"--input-shape {name}: the model has no input {name!r}; its inputs: {', '.join(inputs)}")
        _require_fitting_shape(name, dims, declared[name])
    node_names = {n.name or f"{n.op_type}#{i}" for i, n in enumerate(graph.node)}
    for name in nodes:
        if name not in node_names:
            raise UsageError(f"--node {name}: no node of that name in the model")
    values = initializers | set(inputs) | {o for n in graph.node for o in n.output}
    for name in tensors:
        if name not in values:
            raise UsageError(f"--tensor {name}: no tensor of that name in the model")


def _require_fitting_shape(name: str, dims: Sequence[int], info: onnx.ValueInfoProto) -> None:
    """``--input-shape NAME=...`` must have the input's rank and agree with its fixed dims."""
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type") or not tensor.HasField("shape"):
        return
    want = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim]
    given = ",".join(map(str, dims))
    if len(dims) != len(want):
        raise UsageError(f"--input-shape {name}={given}: {name!r} has rank {len(want)} {want}, "
                         f"so give {len(want)} dims ({name}={','.join(str(d) if isinstance(d, int) else '2' for d in want)})")
    for axis, (w, d) in enumerate(zip(want, dims)):
        if d < 1:
            raise UsageError(f"--input-shape {name}={given}: dims must be >= 1")
        if isinstance(w, int) and w > 0 and w != d:
            raise UsageError(f"--input-shape {name}={given}: axis {axis} of {name!r} is {w}, got {d}")


def require_annotations(model: onnx.ModelProto, path: str) -> None:
    """A model without a device configuration has nothing to check or explain."""
    if not len(model.configuration) and not any(n.device_configurations for n in model.graph.node):
        raise CliError(
            f"{path} has no sharding annotations (no device configuration): nothing to check; "
            f"annotate it first (onnx2jax annotate {path} --plan megatron --devices N -o out.onnx)"
        )


def load(path: str) -> onnx.ModelProto:
    """The model, not inlined (its node names are the ones the user wrote); its weights stay on disk."""
    return open_model(path, inline=False)[0]  # a ModelLoadError names the file; onnx2jax.cli.app prints it


def severity_counts(diags: Sequence[Diagnostic]) -> dict[str, int]:
    """How many errors, warnings and notes."""
    return {s: sum(d.severity == s for d in diags) for s in ("error", "warning", "note")}


def diagnostics_table(diags: Sequence[Diagnostic], title: str | None = None):
    """A rich table with one row per diagnostic."""
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


def summary_line(counts: dict[str, int]) -> str:
    """One line: the counts, errors in red."""
    if counts["error"]:
        head = f"[bold red]{counts['error']} error(s)[/]"
    else:
        head = "[bold green]no errors[/]"
    return f"{head}, {counts['warning']} warning(s), {counts['note']} note(s)"


def print_stages(console, diags: Sequence[Diagnostic]) -> None:
    """One line per pipeline stage (nodes, devices, what it sends), for a staged model."""
    for d in diags:
        if d.code == codes.PIPELINE_STAGE:
            console.print(d.message, markup=False)


def run(args: argparse.Namespace) -> int:
    """Checks the annotations (and with ``--target`` compiles for it); prints a table or JSON; exit status 1
    when there are errors."""
    target_of(args)  # a bad --target is a usage error before anything runs
    model = load(args.model)
    require_names(model, parse_input_shapes(args.input_shape))
    require_annotations(model, args.model)
    with terminal.make_console(stderr=True).status(f"checking {args.model} ..."):  # a spinner on terminals
        diags, _, _ = checked(model, args.configuration, parse_input_shapes(args.input_shape), args.strict)
    counts = severity_counts(diags)
    which = configuration_line(model, args.configuration)
    compiled = target_summary(args, args.model, args.configuration) if not counts["error"] else None
    if args.json:
        print(json.dumps({
            "model": args.model,
            "configuration": choose_configuration(model, args.configuration).name,
            "valid": counts["error"] == 0,
            "counts": counts,
            "diagnostics": [dataclasses.asdict(d) for d in diags],
            **({} if compiled is None else {"target": {k: v for k, v in compiled.items() if k not in ("lines", "report")}}),
        }, indent=2))
    else:
        console = terminal.make_console()
        shown = [d for d in diags if args.notes or d.severity != "note"]
        if shown:
            console.print(diagnostics_table(shown, f"{args.model}: sharding annotations"))
        print_stages(console, diags)
        if which:
            console.print(which, markup=False)
        for line in [] if compiled is None else compiled["lines"]:
            console.print(line, markup=False)
        hidden = "" if args.notes or not counts["note"] else " (--notes lists the notes)"
        console.print(summary_line(counts) + hidden)
    does_not_fit = compiled is not None and compiled.get("fits") is False  # the target's chips cannot hold it
    if does_not_fit and not args.json:
        print(f"error: {_not_fitting(compiled['report'])}", file=sys.stderr)
    return 1 if counts["error"] or does_not_fit else 0


def _not_fitting(report: Any) -> str:
    """The ChipMemoryError a program whose peak exceeds its chips' HBM is (onnx2jax.runtime.tpu_report)."""
    try:
        report.check_fits()
    except Exception as error:  # noqa: BLE001 - ChipMemoryError, whose message names the chip and the bytes
        return str(error)
    return "the program fits"


def target_summary(args: argparse.Namespace, model: Any, configuration: str | None) -> dict | None:
    """With ``--target``: ``model`` compiled for it at ``--input-shape``'s shapes (:mod:`onnx2jax.cli.target`),
    else None (the target is parsed first: a bad name is a usage error before anything compiles)."""
    target = target_of(args)
    if target is None:
        return None
    from onnx2jax.cli.target import compile_for_target

    with terminal.make_console(stderr=True).status(f"compiling for {target.name} ..."):
        return compile_for_target(model, target, configuration, parse_input_shapes(args.input_shape))


def configuration_line(model: onnx.ModelProto, asked: str | None) -> str | None:
    """Which configuration was checked, for a model that defines several; None when it defines one or none.

    ``check`` takes the first when none is asked for; ``compile`` (and ``run``) refuse to guess, so the
    line says so.
    """
    choice = choose_configuration(model, asked)
    if len(choice.defined) < 2 or choice.unknown:
        return None
    if asked is not None:
        return f"checked configuration {asked!r} of {list(choice.defined)}"
    return (f"checked configuration {choice.name!r}, the first of {list(choice.defined)}; onnx2jax.compile and "
            "onnx2jax run refuse to guess: pass configuration=NAME (--configuration NAME, here too)")


def checked(model: onnx.ModelProto, configuration: str | None, shapes: dict, strict: bool):
    """(diagnostics, inference, segments) as compile() sees the model.

    A segmented model (data-dependent output shapes) is inferred one jitted
    segment at a time, as compile() runs it; segments is None otherwise.
    """
    unsupported = "error" if strict else "warning"
    diagnostics, inference = check_and_infer(model, configuration, input_shapes=shapes, unsupported=unsupported)
    sharded = _segments(model, inference.configuration, shapes, unsupported)
    if sharded is not None:
        inference = merged_inference(sharded, inference.configuration)
        diagnostics = merge(validate_model(model, input_shapes=shapes), inference.diagnostics)
    return diagnostics, inference, sharded


def _segments(model: onnx.ModelProto, configuration: str | None, shapes: dict, unsupported: str):
    """A segmented model's jitted segments, annotated and inferred as compile() does; None if it is one program."""
    cuts = segments.data_dependent_nodes(model)
    if not cuts or configuration is None:
        return None
    return shard_segments(segments.plan(model, cuts), configuration, input_shapes=shapes, unsupported=unsupported)


