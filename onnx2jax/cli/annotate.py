"""``onnx2jax annotate``: write sharding specs and pipeline stages into a model.

Examples::

    onnx2jax annotate model.onnx --plan megatron --devices 8 -o out.onnx
    onnx2jax annotate llama.onnx --plan megatron --devices 8 --gqa groups -o out.onnx
    onnx2jax annotate model.onnx --devices 2 --spec "W=1:2 @ [0,1]" --stage mm=0 -o out.onnx
    onnx2jax annotate llama.onnx --stages shard.yaml -o out.onnx              # PopRT sharding points
    onnx2jax annotate llama.onnx --stages auto:2 --devices 8 --plan megatron -o out.onnx
    onnx2jax annotate model.onnx --auto --devices 8 --batch 4 --memory 16GB -o out.onnx

``--auto`` searches the fastest layout instead (:mod:`onnx2jax.cli.annotate_auto`,
docs/auto-plans.md).

``--stages`` takes PopRT's sharding-points YAML (a list of ``{node, device,
stage}``) or ``auto:S`` (S stages balanced by estimated time at ``--stage-shape
BATCHxSEQUENCE``, default 1x128, cut where one activation crosses; the
expected balance is printed). Each distinct ``device`` is a group of N/G of the
``--devices N`` devices (one device each without ``--devices``); with
``--plan megatron`` the tensor-parallel plan runs inside each group.

The plan (if any) is applied first, then each ``--spec`` (written where the
tensor is defined: on its producer, or on every reader of a model input or
initializer), then each ``--stage``. The result is validated structurally and
written only when it has no error. It prints what it wrote (the configuration,
how many annotations on how many nodes, the plan's notes); ``--verbose`` adds
the table of every annotation.
"""

from __future__ import annotations

import argparse
import os

import onnx
from rich.table import Table

from onnx2jax.cli import annotate_auto
from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError, check_writable
from onnx2jax.cli.options import add_target_arguments, add_verbose_argument, byte_count
from onnx2jax.errors import ModelLoadError
from onnx2jax.loading import open_model
from onnx2jax.saving import save_model
from sharding.diagnostics import ShardingError
from sharding.annotate import add_configuration, annotate_tensor, describe_plan, name_nodes, set_stage
from sharding.megatron import megatron_layout, megatron_plan
from sharding.stages import (
    StageAssignment,
    annotate_stages,
    auto_stages,
    device_groups,
    load_points_yaml,
    stages_from_points,
)
from sharding.text import SpecSyntaxError, parse_spec
from sharding.validate import validate_model


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``annotate`` sub-command to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "annotate",
        help="write sharding specs / pipeline stages into a model (e.g. a Megatron TP plan)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="the .onnx model to annotate")
    parser.add_argument("--plan", choices=["megatron"], help="a whole-model plan to apply first")
    parser.add_argument("--devices", type=int, metavar="N", help="devices of the configuration")
    parser.add_argument(
        "--gqa",
        choices=["replicate", "groups"],
        default="replicate",
        help="megatron: k/v projections with fewer heads than shards are replicated "
        "(default) or split by kv heads over device groups",
    )
    parser.add_argument(
        "--configuration", default="tp", metavar="NAME", help="configuration name (default: tp)"
    )
    parser.add_argument(
        "--spec",
        action="append",
        default=[],
        metavar="TENSOR=TEXT",
        help='a spec in the text notation, e.g. "W=1:2 @ [0,1]" (repeatable)',
    )
    parser.add_argument(
        "--stage", action="append", default=[], metavar="NODE=INT", help="a pipeline stage (repeatable)"
    )
    parser.add_argument(
        "--stages",
        metavar="YAML|auto:S",
        help="pipeline stages: PopRT's sharding-points YAML, or auto:S for S balanced stages",
    )
    parser.add_argument(
        "--stage-shape",
        default="1x128",
        metavar="BxS",
        help="auto:S: the batch x sequence the stages' times are estimated at (default 1x128)",
    )
    parser.add_argument(
        "--name-nodes", action="store_true", help="give unnamed and duplicate-named nodes unique names first"
    )
    parser.add_argument("-o", "--output", required=True, help="where to write the annotated model")
    parser.add_argument(
        "--external-data-size",
        type=byte_count,
        metavar="SIZE",
        help="copy the weights into new external data files of at most SIZE each (e.g. 2GB, 500MB); "
        "by default the output is a small .onnx that reads the source model's external data",
    )
    annotate_auto.add_arguments(parser)
    add_target_arguments(parser)
    add_verbose_argument(parser, "the table of every annotation written (node, op, tensor, spec, role)")
    return parser


def _pair(item: str, option: str, what: str) -> tuple[str, str]:
    name, sep, value = item.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise UsageError(f"{option} expects {what}, got {item!r}")
    return name.strip(), value.strip()


def _annotate(args: argparse.Namespace, model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], dict[str, str]]:
    notes: list[str] = []
    roles: dict[str, str] = {}
    config = args.configuration
    if args.devices is not None and args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    specs = []  # parsed before anything is written, so that typos fail fast
    for item in args.spec:
        tensor, text = _pair(item, "--spec", "TENSOR=TEXT")
        try:
            specs.append((tensor, parse_spec(text, tensor)))
        except SpecSyntaxError as e:
            raise UsageError(f"--spec {tensor}: {e}") from None
    stages = []
    for item in args.stage:
        node, value = _pair(item, "--stage", "NODE=INT")
        try:
            stages.append((node, int(value)))
        except ValueError:
            raise UsageError(f"--stage expects NODE=INT, got {item!r}") from None
    if args.name_nodes:
        name_nodes(model)
    annotate_auto.require_auto(args, target=True)  # --target: the automatic plan for a TPU topology
    if args.auto:
        if args.plan or args.stages or specs or stages:
            raise UsageError("--auto writes the whole plan: it goes without --plan, --stages, --spec and --stage")
        model, notes = annotate_auto.annotate_auto(args, model)
        return model, notes, {}
    if args.stages:
        return _annotate_stages(args, model, specs, stages)
    if args.plan == "megatron":
        if args.devices is None:
            raise UsageError("--plan megatron needs --devices N")
        model = megatron_plan(model, args.devices, config, gqa=args.gqa)
        roles = _megatron_notes(model, args.devices, args.gqa, notes)
    if args.spec or args.stage:
        if config not in {c.name for c in model.configuration}:
            if args.devices is None:
                raise UsageError(f"configuration {config!r} is not in the model; pass --devices N")
            add_configuration(model, config, args.devices)
    for tensor, spec in specs:
        for node in annotate_tensor(model, tensor, spec, config):
            roles.setdefault(node, "--spec")
    for node, stage in stages:
        set_stage(model, node, stage, config)
        roles.setdefault(node, "--stage")
    return model, notes, roles


def _megatron_notes(model: onnx.ModelProto, ways: int, gqa: str, notes: list[str]) -> dict[str, str]:
    """Appends the plan's summary and notes; returns node -> Megatron role."""
    layout = megatron_layout(model, ways, gqa=gqa)
    kinds = [p.kind for p in layout.pairs if p.ways > 1]
    notes.append(
        f"{kinds.count('attention')} attention and {kinds.count('mlp')} MLP column/row pairs"
        + (f", LM head {layout.lm_head}" if layout.lm_head else "")
    )
    notes += layout.notes
    return layout.roles()


def _annotate_stages(
    args: argparse.Namespace, model: onnx.ModelProto, specs: list, stages: list
) -> tuple[onnx.ModelProto, list[str], dict[str, str]]:
    """``--stages``: stages and device groups, then (with ``--plan megatron``) TP inside each group."""
    if specs or stages:
        raise UsageError("--stages cannot be combined with --spec or --stage")
    notes: list[str] = []
    roles: dict[str, str] = {}
    if args.stages.startswith("auto:"):
        try:
            count = int(args.stages[5:])
        except ValueError:
            raise UsageError(f"--stages auto:S needs an integer S, got {args.stages!r}") from None
        batch, _, sequence = args.stage_shape.lower().partition("x")
        try:
            batch, sequence = int(batch), int(sequence)
        except ValueError:
            raise UsageError(f"--stage-shape expects BATCHxSEQUENCE such as 1x128, got {args.stage_shape!r}") from None
        stage_of, cut = auto_stages(model, count, batch=batch, sequence=sequence)
        assignment = StageAssignment.one_group_per_stage(stage_of)
        notes += cut.describe()
        sizes = dict(enumerate(cut.param_bytes))
    else:
        try:
            with open(args.stages, encoding="utf-8") as f:
                points = load_points_yaml(f.read())
        except OSError as e:
            raise UsageError(f"--stages: cannot read {args.stages!r}: {e}") from None
        assignment = stages_from_points(model.graph, *points)
        sizes = {}
    megatron = args.plan == "megatron"
    if megatron and args.devices is None:
        raise UsageError("--plan megatron with --stages needs --devices N")
    model = annotate_stages(
        model, assignment, args.devices, args.configuration, tensor_parallel=megatron, gqa=args.gqa
    )
    groups = device_groups(list(assignment.group.values()), args.devices)
    devices = {s: groups[g] for s, g in assignment.group.items()}
    if megatron:
        roles = _megatron_notes(model, len(next(iter(devices.values()))), args.gqa, notes)
    stage_of = assignment.stage
    for stage in sorted(devices):
        members = [n for n, s in stage_of.items() if s == stage]
        weight = f", {sizes[stage]:,} parameter bytes" if stage in sizes else ""
        notes.append(f"stage {stage}: {len(members)} nodes on devices {list(devices[stage])}{weight}")
    return model, notes, roles


def require_annotations(model: onnx.ModelProto, plan: str, devices: int, notes: list[str]) -> None:
    """Fails when a plan wrote no annotation: a model that shards nothing is not what was asked for.

    Raises:
      CliError: naming the plan, the device count and the first reason the plan gave.
    """
    if describe_plan(model):
        return
    why = f": {notes[0]}" if notes else ""
    more = f" (and {len(notes) - 1} more notes)" if len(notes) > 1 else ""
    raise CliError(
        f"the {plan} plan for {devices} devices shards nothing{why}{more}; "
        "choose a --devices count that divides the heads and features, or annotate with --spec"
    )


def run(args: argparse.Namespace) -> int:
    """Annotates a model and writes it; prints a summary (``--verbose``: every annotation).

    Annotations with errors are refused as a `ShardingError` (one line per error, on stderr), and nothing is written.
    """
    check_writable("-o", args.output, ".onnx")
    console = terminal.make_console()
    with terminal.make_console(stderr=True).status(f"annotating {args.model} ..."):  # a spinner on terminals
        model, source_dir = open_model(args.model, inline=False)  # the weights stay on disk
        model, notes, roles = _annotate(args, model)
        if args.plan:
            require_annotations(model, args.plan, args.devices, [n for n in notes[1:]])
        diagnostics = validate_model(model)
    if any(d.severity == "error" for d in diagnostics):
        raise ShardingError(diagnostics)
    rows = describe_plan(model)
    if args.verbose:
        console.print(_table(rows, roles, args.model), markup=False)
    for note in notes:
        console.print(f"note: {note}", markup=False)
    for diagnostic in diagnostics:
        console.print(str(diagnostic), markup=False)
    try:
        written = save_model(model, args.output, source_dir, data_size=args.external_data_size)
    except ModelLoadError as e:
        raise CliError(f"not written: {e}") from None
    nodes = len({r.node for r in rows})
    configs = ", ".join(f"{c.name!r} on {c.num_devices} devices" for c in model.configuration)
    data = f"; weights in {', '.join(os.path.basename(w) for w in written[1:])}" if written[1:] else ""
    console.print(f"wrote {args.output}: {len(rows)} annotations on {nodes} nodes ({configs}){data}"
                  + ("" if args.verbose else "; --verbose lists them"), markup=False)
    return 0


def _table(rows, roles: dict[str, str], path: str) -> Table:
    """Every written annotation: node, op, tensor, spec, (stage,) role."""
    table = Table(title=f"annotations of {path}")
    staged = any(row.stage is not None for row in rows)
    columns = ("node", "op", "tensor", "spec") + (("stage",) if staged else ()) + ("role",)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        cells = [row.node, row.op_type, row.tensor, row.spec]
        if staged:
            cells.append("" if row.stage is None else str(row.stage))
        table.add_row(*cells, roles.get(row.node, ""))
    return table
