"""``onnx2jax bench``: onnx2jax against onnxruntime (CPU), per call and first call, as a markdown table.

Examples::

    onnx2jax bench                                   # the repository's tiny Llama, GPT-2 and BERT fixtures
    onnx2jax bench model.onnx --dim batch=8 --dim seq=256
    onnx2jax bench --output results.md --plot results.png
    onnx2jax bench --quick                           # a smoke run: few calls

A model's inputs are ``MODEL.inputs.npz`` next to it when that file exists,
else random (as ``onnx2jax run`` draws them; ``--dim`` sets symbolic dims).
The two runtimes are called alternately in one process after warm-up
(onnxruntime's idle intra-op threads not spinning, so they do not starve the
onnx2jax call after them); the
table gives the median and interquartile range of each, the ratio of the
medians (onnx2jax / onnxruntime: below 1, onnx2jax is faster), the first call
of each (onnx2jax: load + trace + compile + run, without the persistent
compilation cache; onnxruntime: session creation + run) and the largest
difference between their outputs. ``--plot`` needs matplotlib (``pip install
'onnx2jax[plot]'``).
"""

from __future__ import annotations

import argparse
import os
import pathlib

import numpy as np

from onnx2jax.cli_errors import CliError, UsageError, check_writable, require_matplotlib

FIXTURES = ("tiny_llama", "tiny_gpt2", "tiny_bert")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``bench`` sub-command to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "bench",
        help="time onnx2jax against onnxruntime: a markdown table (and a plot)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("models", nargs="*", metavar="MODEL.onnx",
                        help="models to time (default: tests/data/tiny_{llama,gpt2,bert}.onnx of the checkout)")
    parser.add_argument("--repeats", type=int, default=50, metavar="N",
                        help="alternating timed calls of each runtime (default 50; 3 with --quick)")
    parser.add_argument("--warmup", type=int, default=3, metavar="N",
                        help="untimed calls of each runtime first (default 3; 1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few calls, figures not meaningful")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT",
                        help="size of a symbolic dim of random inputs (models without MODEL.inputs.npz)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random inputs (default 0)")
    parser.add_argument("--output", metavar="FILE.md", help="also write the table (and how it was taken) here")
    parser.add_argument("--plot", metavar="FILE.png", help="also write a plot (needs matplotlib)")
    from onnx2jax.cli import add_scan_argument

    add_scan_argument(parser)
    parser.set_defaults(func=cmd_bench)
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    """Times every model, prints the table, writes ``--output`` / ``--plot``."""
    from onnx2jax import benchmark
    from onnx2jax.cli import _console, scan_setting

    repeats = 3 if args.quick and args.repeats == 50 else args.repeats
    warmup = 1 if args.quick and args.warmup == 3 else args.warmup
    if repeats < 1 or warmup < 0:
        raise UsageError(f"--repeats must be at least 1 and --warmup at least 0; got {repeats} and {warmup}")
    for option, path, suffix in (("--output", args.output, ".md"), ("--plot", args.plot, ".png")):
        check_writable(option, path, suffix)
    if args.plot:
        require_matplotlib()  # before the long run; benchmark.plot imports it
    try:
        import onnxruntime  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CliError("bench compares with onnxruntime: pip install onnxruntime") from e

    console = _console()
    paths = args.models or _default_models(console)
    rows = []
    for path in paths:
        inputs = _inputs_for(path, args, console)
        with console.status(f"timing {path} ..."):
            rows.append(benchmark.bench_model(path, inputs, repeats, warmup, scan_layers=scan_setting(args.scan_layers)))
    table = benchmark.markdown_table(rows)
    note = benchmark.environment_note(repeats, warmup)
    console.print(table, markup=False, soft_wrap=True)
    console.print(f"\n{note}", markup=False)
    if args.output:
        pathlib.Path(args.output).write_text(f"{table}\n\n{note}\n")
        console.print(f"wrote {args.output}", markup=False)
    if args.plot:
        benchmark.plot(rows, args.plot)
        console.print(f"wrote {args.plot}", markup=False)
    return 0


def _default_models(console) -> list[str]:
    """The checkout's transformer fixtures; in an installed wheel (no tests/), the bundled tiny Llama, said."""
    root = pathlib.Path(__file__).resolve().parents[1]
    fixtures = [root / "tests" / "data" / f"{name}.onnx" for name in FIXTURES]
    if all(f.exists() for f in fixtures):
        return [str(f) for f in fixtures]
    bundled = pathlib.Path(__file__).resolve().parent / "data" / "tiny_llama.onnx"
    console.print(f"note: no tests/data fixtures next to this installation; timing the bundled {bundled.name} only "
                  "(run from a clone for all three, or name models)", markup=False)
    return [str(bundled)]


def _inputs_for(path: str, args: argparse.Namespace, console) -> dict[str, np.ndarray]:
    """``MODEL.inputs.npz`` when it exists, else random inputs for the model's declared types."""
    import onnx2jax
    from onnx2jax.cli_inputs import conform, parse_dims, random_inputs, symbolic_dims

    if not os.path.exists(path):
        raise CliError(f"no such file: {path}")
    stored = pathlib.Path(path).with_suffix(".inputs.npz")
    model = onnx2jax.translate(path)
    if stored.exists():
        with np.load(stored) as loaded:
            given = conform({k: loaded[k] for k in loaded.files}, model)
        missing = [n for n in model.input_names if n not in given.values]
        if missing:
            raise CliError(f"{stored} lacks model inputs {', '.join(missing)}")
        for note in given.notes:
            console.print(f"note: {note}", markup=False)
        return {n: given.values[n] for n in model.input_names}
    drawn = random_inputs(model, args.seed, parse_dims(args.dim, symbolic_dims(model)))
    for note in drawn.notes:
        console.print(f"note: {path}: {note}", markup=False)
    return drawn.values
