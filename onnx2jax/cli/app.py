"""The ``onnx2jax`` command line: one sub-command per task, errors as one line (see onnx2jax.cli.errors)."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from typing import Sequence

import numpy as np

from onnx2jax.runtime import compilation_cache


def _console():
    from onnx2jax.cli.console import make_console

    return make_console()


_SCAN_CHOICES = {"auto": "auto", "on": True, "off": False}


def add_scan_argument(parser: argparse.ArgumentParser) -> None:
    """``--scan-layers auto|on|off``: run a transformer's repeated layers as one lax.scan (onnx2jax.scan)."""
    parser.add_argument(
        "--scan-layers", choices=sorted(_SCAN_CHOICES), default="auto",
        help="run the repeated layers of a transformer as one lax.scan, so compile time does not grow with "
             "depth: auto (default: from 16 repeated layers), on (or fail saying why), off (unrolled)",
    )


def scan_setting(choice: str) -> bool | str:
    """The ``scan_layers`` argument of ``onnx2jax.translate`` for a ``--scan-layers`` choice."""
    return _SCAN_CHOICES[choice]


def cmd_run(args: argparse.Namespace) -> int:
    """Runs a model on given or random inputs; optionally saves the outputs and compares with onnxruntime."""
    from onnx2jax.cli.inputs import conform, parse_dims, random_inputs, read_input_files, symbolic_dims

    _check_output_path(args.output)
    if args.microbatches != 1 and not args.devices:
        from onnx2jax.cli.errors import UsageError

        raise UsageError("--microbatches splits the batch of a model with pipeline stages; it goes with --devices N")
    if args.devices:
        from onnx2jax.cli.demo import ensure_devices

        ensure_devices(args.devices)
    import onnx2jax

    console = _console()
    if args.devices:
        _check_annotated(args.model, args.devices)
        runner = onnx2jax.compile(
            args.model, microbatches=args.microbatches, scan_layers=scan_setting(args.scan_layers)
        )
        model = runner.model
    else:
        runner = model = onnx2jax.translate(args.model, scan_layers=scan_setting(args.scan_layers))
        if model.segments:
            from sharding.segments import describe

            console.print(f"runs in {len(model.segments)} segments (data-dependent output shapes):", markup=False)
            for line in describe(model.segments):
                console.print(f"  {line}", markup=False)
    dims = parse_dims(args.dim, symbolic_dims(model))
    given = conform(read_input_files(args.input, model.input_names), model)
    drawn = random_inputs(model, args.seed, dims, skip=list(given.values))
    inputs = {**drawn.values, **given.values}
    for note in drawn.notes + given.notes:
        console.print(f"note: {note}", markup=False)
    with console.status(f"tracing and compiling {args.model} ..."), compilation_cache.watch() as lookups:
        first, outputs, steady, calls = _timed_calls(runner, inputs)
    console.print(
        f"first call {first:.2f}s (trace + {lookups.describe()} + run), then {_ms(steady)} per call (mean of {calls})"
    )
    console.print(model.layers_report(), markup=False)
    if args.devices:
        runner.report(**inputs).render(console)
    if args.output:
        np.savez(args.output, **dict(zip(model.output_names, outputs, strict=True)))
    reference, why_not = _onnxruntime_outputs(args.model, inputs) if args.check else (None, None)
    worst, nonfinite = 0.0, []
    for index, (name, out) in enumerate(zip(model.output_names, outputs)):
        line = f"{name}: shape {out.shape} dtype {out.dtype}"
        if reference is not None:
            diff = _max_abs_diff(out, reference[index])
            worst = max(worst, diff)
            line += f"  max |diff| vs onnxruntime {diff:.3g}"
            nonfinite += _nonfinite_where_finite(name, out, reference[index])
        console.print(line, markup=False)
    if args.output:
        console.print(f"wrote {args.output}: {', '.join(model.output_names)}", markup=False)
    if why_not is not None:
        console.print(f"not checked: onnxruntime cannot run this model: {why_not}", markup=False)
        return 1
    if nonfinite:
        console.print(f"[red]{'; '.join(nonfinite)}[/red]")
        return 1
    if reference is not None and worst > args.tolerance:
        console.print(f"[red]max |diff| {worst:.3g} exceeds tolerance {args.tolerance:g}[/red]")
        return 1
    return 0


def _check_output_path(path: str | None) -> None:
    """Fails before any compile when ``--output`` cannot be written."""
    from onnx2jax.cli.errors import UsageError

    if path is None:
        return
    if not path.endswith(".npz"):
        raise UsageError(f"--output writes a .npz file; got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--output {path}: folder {folder} does not exist")


def _check_annotated(path: str, devices: int) -> None:
    """``--devices N`` needs a model with a device configuration of at most N devices."""
    from onnx2jax.cli.errors import CliError, UsageError
    from sharding.model_arg import as_model_proto
    from sharding.spec import device_configurations

    configurations = device_configurations(as_model_proto(path))  # external weights stay on disk
    if not configurations:
        raise CliError(
            f"{path} has no sharding annotations, so --devices {devices} has nothing to shard; "
            f"annotate it first (onnx2jax annotate {path} --plan megatron --devices {devices} -o out.onnx) "
            "or leave out --devices"
        )
    name, config = next(iter(configurations.items()))
    if config.num_devices > devices:
        raise UsageError(f"configuration {name!r} of {path} needs {config.num_devices} devices; "
                         f"pass --devices {config.num_devices}")


def _timed_calls(runner, inputs: dict[str, np.ndarray], budget: float = 1.0, most: int = 20):
    """(seconds of the first call, its outputs as numpy, mean seconds of later calls, how many)."""
    import jax

    start = time.perf_counter()
    outputs = [np.asarray(o) for o in jax.block_until_ready(runner(**inputs))]
    first = time.perf_counter() - start
    calls, spent = 0, 0.0
    while calls < most and (calls < 2 or spent < budget):
        start = time.perf_counter()
        jax.block_until_ready(runner(**inputs))
        spent += time.perf_counter() - start
        calls += 1
    return first, outputs, spent / calls, calls


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.2f}s"


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest |a - b|; NaN in both or equal infinities count as equal, any other NaN as inf."""
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    with np.errstate(invalid="ignore"):  # inf - inf
        diff = np.abs(a - b)
    return float(np.max(np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf))))


def _nonfinite_where_finite(name: str, out: np.ndarray, reference: np.ndarray) -> list[str]:
    """One message if ``out`` has NaN or inf where onnxruntime's ``reference`` is finite."""
    if out.shape != reference.shape or out.dtype.kind not in "fc":
        return []
    bad = ~np.isfinite(out) & np.isfinite(reference)
    if not bad.any():
        return []
    nans, infs = int(np.isnan(out[bad]).sum()), int(np.isinf(out[bad]).sum())
    return [f"{name}: {nans} NaN and {infs} inf where onnxruntime's output is finite"]


def _onnxruntime_outputs(model_path: str, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray] | None, str | None]:
    """onnxruntime's outputs, or None and why onnxruntime could not run the model."""
    from onnx2jax.cli.errors import CliError

    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CliError("--check needs onnxruntime: pip install onnxruntime") from e
    try:
        session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        return session.run(None, inputs), None
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors; our outputs are still shown
        return None, str(e).strip().splitlines()[0][:300]


def cmd_conformance(args: argparse.Namespace) -> int:
    """Runs ONNX's node test cases and prints the pass rate; exit 1 when a case not known to fail fails."""
    import difflib
    import warnings

    from onnx2jax.cli.errors import UsageError
    from onnx2jax.conformance import expected_failures, node_cases, pass_rates, run_cases, tested_ops

    console = _console()
    cases = node_cases()
    if args.op:
        tested = tested_ops(cases)
        known = sorted(set(tested.values()))
        if args.op not in known:
            close = difflib.get_close_matches(args.op, known, n=3)
            raise UsageError(f"--op {args.op}: no node case tests that op type"
                             + (f"; did you mean {', '.join(close)}?" if close else " (op types are case-sensitive)"))
        cases = [c for c in cases if tested.get(c.name) == args.op]
    with warnings.catch_warnings(), _progress(console, len(cases)) as advance:
        warnings.simplefilter("ignore")  # jax's dtype warnings for the cases' float64 data, once per case
        results = run_cases(cases, advance)
    failed = [r for r in results if not r.passed]
    known_failures = expected_failures()
    unexpected = [r for r in failed if r.name not in known_failures]
    for r in failed if args.verbose else unexpected:
        tag = "xfail" if r.name in known_failures else "FAIL"
        error = " ".join(r.error.split())  # one line per case
        console.print(f"{tag} {r.name} [{','.join(r.op_types)}]: {error[:200]}", markup=False)
    overall, *by_category = pass_rates(results)
    console.print(f"{overall}; {len(failed) - len(unexpected)} known failures (node_xfails.yaml), "
                  f"{len(unexpected)} unexpected", markup=False)
    for line in by_category:
        console.print(line, markup=False)
    return 1 if unexpected else 0


def _progress(console, total: int):
    """A context giving a callback that advances a done/total bar with an ETA (shown on terminals only)."""
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    @contextlib.contextmanager
    def bar():
        if not console.is_terminal:
            yield lambda _result: None
            return
        with Progress(TextColumn("node cases"), BarColumn(), MofNCompleteColumn(), TextColumn("ETA"),
                      TimeRemainingColumn(), console=console, transient=True) as progress:
            task = progress.add_task("cases", total=total)
            yield lambda _result: progress.advance(task)

    return bar()


def cmd_demo(args: argparse.Namespace) -> int:
    from onnx2jax.cli.demo import run_demo

    return run_demo(_console(), args.model, args.devices)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnx2jax",
        description="Run ONNX models on JAX/XLA, sharded from ONNX's multi-device annotations.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")

    demo = sub.add_parser("demo", help="tiny Llama, tensor parallel on 8 devices, checked against the unsharded run")
    demo.add_argument("--model", default=None, help="an ONNX transformer (default: the bundled tiny Llama)")
    demo.add_argument("--devices", type=int, default=8, metavar="N",
                      help="tensor-parallel degree (default 8; must divide the heads and the vocabulary)")
    compilation_cache.add_arguments(demo)
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", help="run a model on random or given inputs")
    run.add_argument("model", help="the .onnx file")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input from a .npy (or one-array .npz) file, or FILE.npz holding arrays named "
                          "after the inputs (repeatable; the rest are random)")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=INT",
                     help="size of a symbolic dim of the random inputs (default 2, said when used)")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    run.add_argument("--output", metavar="OUT.npz", help="save the outputs, by output name")
    run.add_argument("--check", action="store_true",
                     help="compare with onnxruntime (exit 1 if it differs or cannot run the model)")
    run.add_argument("--tolerance", type=float, default=1e-4, help="max |diff| allowed by --check (default 1e-4)")
    run.add_argument("--devices", type=int, default=0, metavar="N",
                     help="run sharded on N devices from the model's annotations")
    run.add_argument("--microbatches", type=int, default=1, metavar="M",
                     help="with --devices, for a model with pipeline stages: split each call's batch into M "
                          "micro-batches run fill-drain through the stages (default 1)")
    add_scan_argument(run)
    compilation_cache.add_arguments(run)
    run.set_defaults(func=cmd_run)

    conf = sub.add_parser(
        "conformance",
        help="ONNX node test cases: print passed/total",
        description="Runs ONNX's node test cases (from the onnx wheel) through onnx2jax and prints passed/total. "
        "Exit status 1 when a case fails that is not listed in node_xfails.yaml (the known failures, "
        "each with its reason); 0 otherwise.",
    )
    conf.add_argument("--op", default="", metavar="OP_TYPE",
                      help="only the cases that test this op type (exact, e.g. Softmax; its *_expanded cases included)")
    conf.add_argument("-v", "--verbose", action="store_true", help="list every failure, known ones included")
    conf.set_defaults(func=cmd_conformance)

    from onnx2jax.cli.annotate import add_parser as add_annotate_parser

    add_annotate_parser(sub)

    from onnx2jax.cli.check import add_check_parser, add_explain_parser

    add_check_parser(sub)
    add_explain_parser(sub)

    from onnx2jax.cli.bench import add_parser as add_bench_parser

    add_bench_parser(sub)
    _finish(parser, sub)
    return parser


_DEBUG_HELP = "show the Python traceback of an error (also ONNX2JAX_DEBUG=1)"


def _version() -> str:
    from onnx2jax import __version__

    return __version__


def _plain(text: str | None) -> str | None:
    """A module docstring as help text: reStructuredText's ``code``, `refs` and ``Examples::`` made plain."""
    if text is None:
        return None
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r":\w+:`([^`]+)`|`([^`]+)`", lambda m: m.group(1) or m.group(2), text)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def _finish(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Names every sub-command in the top-level description, and gives each one ``--debug``."""
    names = ", ".join(sub.choices)
    parser.description = f"{parser.description}\n\ncommands: {names} (onnx2jax COMMAND --help for each)"
    for child in sub.choices.values():
        child.description = _plain(child.description)
        # SUPPRESS: absent from the namespace unless given, so the top-level flag stays.
        child.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx2jax`` script: parses, runs one sub-command, returns the exit status."""
    from onnx2jax.cli.errors import run_guarded

    args = build_parser().parse_args(argv)
    try:
        return run_guarded(args.command, lambda: compilation_cache.apply_arguments(args) or args.func(args), args.debug)
    except BrokenPipeError:
        # The reader went away (``onnx2jax ... | head``): stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
