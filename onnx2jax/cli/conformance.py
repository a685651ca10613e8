"""``onnx2jax conformance``: ONNX's node test cases through onnx2jax, the pass rate and the unexpected failures."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import warnings

from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import UsageError


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``conformance`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "conformance",
        help="ONNX node test cases: print passed/total",
        description="Runs ONNX's node test cases (from the onnx wheel) through onnx2jax and prints passed/total. "
        "Exit status 1 when a case fails that is not listed in node_xfails.yaml (the known failures, "
        "each with its reason); 0 otherwise.",
    )
    parser.add_argument("--op", default="", metavar="OP_TYPE",
                        help="only the cases that test this op type (exact, e.g. Softmax; its *_expanded cases included)")
    parser.add_argument("-v", "--verbose", action="store_true", help="list every failure, known ones included")
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs ONNX's node test cases and prints the pass rate; exit 1 when a case not known to fail fails."""
    # the node cases run through jax: onnx2jax.conformance imports it, so it loads here, not with the parser
    from onnx2jax.conformance import expected_failures, node_cases, op_cases, pass_rates, run_cases, tested_ops

    console = terminal.make_console()
    cases = op_cases(args.op) if args.op else node_cases()
    if args.op and not cases:  # a typo: generate every case, to say which op types exist
        known = sorted(set(tested_ops(node_cases()).values()))
        close = difflib.get_close_matches(args.op, known, n=3)
        raise UsageError(f"--op {args.op}: no node case tests that op type"
                         + (f"; did you mean {', '.join(close)}?" if close else " (op types are case-sensitive)"))
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
    # rich's progress widgets load only when the cases run, not with the parser
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
