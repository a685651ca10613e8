"""The ``onnx2jax`` command line: demo, run, conformance."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np


def _console():
    from rich.console import Console

    return Console(highlight=False, width=max(Console().width, 120))


def random_inputs(model, seed: int = 0, dims: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs matching the model's declared input types; symbolic dims from ``dims`` or 2.

    Integer inputs are drawn from [0, 16) so that ids and indices stay valid for
    small vocabularies; bool inputs (masks) are all True.
    """
    rng = np.random.default_rng(seed)
    dims = dims or {}
    values = {}
    for info in model.inputs:
        shape = tuple(
            d if isinstance(d, int) and d > 0 else dims.get(d, 2) if isinstance(d, str) else 2
            for d in (info.shape or ())
        )
        dtype = info.dtype or np.dtype(np.float32)
        if dtype.kind == "b":
            values[info.name] = np.ones(shape, dtype)
        elif dtype.kind in "iu":
            values[info.name] = rng.integers(0, 16, shape).astype(dtype)
        else:
            values[info.name] = rng.standard_normal(shape).astype(dtype)
    return values


def _parse_inputs(items: Sequence[str]) -> dict[str, np.ndarray]:
    inputs = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            raise SystemExit(f"--input expects NAME=FILE.npy, got {item!r}")
        inputs[name] = np.load(path)
    return inputs


def _parse_dims(items: Sequence[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise SystemExit(f"--dim expects NAME=INT, got {item!r}")
        dims[name] = int(value)
    return dims


def cmd_run(args: argparse.Namespace) -> int:
    """Runs a model on given or random inputs; optionally compares with onnxruntime."""
    if args.devices:
        from onnx2jax.demo import ensure_devices

        ensure_devices(args.devices)
    import onnx2jax

    console = _console()
    model = onnx2jax.translate(args.model)
    inputs = random_inputs(model, args.seed, _parse_dims(args.dim))
    inputs.update(_parse_inputs(args.input))
    runner = onnx2jax.compile(args.model) if args.devices else model
    with console.status(f"tracing and compiling {args.model} ..."):
        start = time.perf_counter()
        outputs = [np.asarray(o) for o in runner(**inputs)]
        elapsed = time.perf_counter() - start
    console.print(f"compiled and ran in {elapsed:.2f}s")
    if args.devices:
        runner.report(**inputs).render(console)
    reference = _onnxruntime_outputs(args.model, inputs) if args.check else None
    worst = 0.0
    for index, (name, out) in enumerate(zip(model.output_names, outputs)):
        line = f"{name}: shape {out.shape} dtype {out.dtype}"
        if reference is not None:
            diff = _max_abs_diff(out, reference[index])
            worst = max(worst, diff)
            line += f"  max |diff| vs onnxruntime {diff:.3g}"
        console.print(line)
    if reference is not None and worst > args.tolerance:
        console.print(f"[red]max |diff| {worst:.3g} exceeds tolerance {args.tolerance:g}[/red]")
        return 1
    return 0


def _max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _onnxruntime_outputs(model_path: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        import onnxruntime as ort
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SystemExit("--check needs onnxruntime: pip install onnxruntime") from e
    session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def cmd_conformance(args: argparse.Namespace) -> int:
    """Runs ONNX's node test cases and prints the pass rate as passed/total."""
    from onnx2jax.conformance import node_cases, run_cases

    console = _console()
    cases = [c for c in node_cases() if not args.op or args.op in c.name or args.op in str(c.model.graph.node[0].op_type)]
    with console.status(f"running {len(cases)} ONNX node cases ..."):
        results = run_cases(cases)
    failed = [r for r in results if not r.passed]
    if args.verbose:
        for r in failed:
            console.print(f"FAIL {r.name} [{','.join(r.op_types)}]: {r.error}", markup=False)
    passed = len(results) - len(failed)
    console.print(f"{passed}/{len(results)} node cases pass ({100 * passed / max(len(results), 1):.1f}%)")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from onnx2jax.demo import run_demo

    return run_demo(_console(), args.model, args.devices)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="onnx2jax", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="tiny Llama, tensor parallel on 8 devices, checked against the unsharded run")
    demo.add_argument("--model", default=None, help="an ONNX transformer (default: the bundled tiny Llama)")
    demo.add_argument("--devices", type=int, default=8)
    demo.set_defaults(func=cmd_demo)

    run = sub.add_parser("run", help="run a model on random or given inputs")
    run.add_argument("model")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    run.add_argument("--dim", action="append", default=[], metavar="NAME=INT", help="size of a symbolic dim")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--check", action="store_true", help="compare with onnxruntime")
    run.add_argument("--tolerance", type=float, default=1e-4)
    run.add_argument("--devices", type=int, default=0, help="run sharded on N devices from the model's annotations")
    run.set_defaults(func=cmd_run)

    conf = sub.add_parser("conformance", help="ONNX node test cases: print passed/total")
    conf.add_argument("--op", default="", help="only cases of this op type")
    conf.add_argument("-v", "--verbose", action="store_true", help="list every failure")
    conf.set_defaults(func=cmd_conformance)

    from onnx2jax.cli_annotate import add_parser as add_annotate_parser

    add_annotate_parser(sub)

    from onnx2jax.cli_check import add_check_parser, add_explain_parser

    add_check_parser(sub)
    add_explain_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
