"""``onnx2jax bench``: onnx2jax against onnxruntime (CPU), per call and first call, as a markdown table.

Examples::

    onnx2jax bench                                   # the tiny fixtures, then the medium transformers
    onnx2jax bench --set medium                      # only the medium Llama-GQA, GPT-2, BERT at 1x128 and 8x256
    onnx2jax bench model.onnx --dim batch=8 --dim seq=256
    onnx2jax bench --output results.md --plot results.png
    onnx2jax bench --quick                           # a smoke run: few calls, the tiny fixtures only

Without named models it times the checkout's tiny Llama, GPT-2 and BERT
fixtures (tests/data) and the medium transformers of
bench/medium_transformers.py (6 layers, width 512, vocabulary 8,192; built on
first use and cached in bench/models/, about 100 MB each) at batch x sequence
1 x 128 and 8 x 256; ``--set`` picks one of the two sets.
A named model's inputs are ``MODEL.inputs.npz`` next to it when that file exists,
else random (as ``onnx2jax run`` draws them; ``--dim`` sets symbolic dims).
The two runtimes are called alternately in one process after warm-up
(onnxruntime's idle intra-op threads not spinning, so they do not starve the
onnx2jax call after them); the
table gives the median and interquartile range of each, the ratio of the
medians (onnx2jax / onnxruntime: below 1, onnx2jax is faster), the first call
of each (onnx2jax: load + trace + compile + run, without the persistent
compilation cache; onnxruntime: session creation + run) and the largest
difference between their outputs. ``--plot`` needs matplotlib (``pip install
matplotlib``; in a clone of onnx2jax, ``pip install -e '.[plot]'``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys

import numpy as np

import onnx2jax  # lazy: its names import jax on first use
from onnx2jax import benchmark
from onnx2jax.bundled import demo_model_path
from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError, check_writable, require_matplotlib
from onnx2jax.cli.inputs import conform, parse_dims, random_inputs, symbolic_dims
from onnx2jax.cli.options import add_scan_argument, scan_setting

FIXTURES = ("tiny_llama", "tiny_gpt2", "tiny_bert")
SETS = ("all", "fixtures", "medium")
ROOT = pathlib.Path(__file__).resolve().parents[2]


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds the ``bench`` sub-command to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "bench",
        help="time onnx2jax against onnxruntime: a markdown table (and a plot)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("models", nargs="*", metavar="MODEL.onnx",
                        help="models to time (default: the --set of the checkout)")
    parser.add_argument("--set", choices=SETS, dest="model_set",
                        help="without named models: the tiny fixtures, the medium transformers, or both "
                             "(default all; fixtures with --quick)")
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
    add_scan_argument(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Times every model, prints the table, writes ``--output`` / ``--plot``."""
    repeats = 3 if args.quick and args.repeats == 50 else args.repeats
    warmup = 1 if args.quick and args.warmup == 3 else args.warmup
    if repeats < 1 or warmup < 0:
        raise UsageError(f"--repeats must be at least 1 and --warmup at least 0; got {repeats} and {warmup}")
    for option, path, suffix in (("--output", args.output, ".md"), ("--plot", args.plot, ".png")):
        check_writable(option, path, suffix)
    if args.plot:
        require_matplotlib()  # before the long run; benchmark.plot imports it
    try:
        import onnxruntime  # noqa: F401 - optional; checked before the long run
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CliError("bench compares with onnxruntime: pip install onnxruntime") from e

    console = terminal.make_console()
    if args.models and args.model_set:
        raise UsageError("--set chooses the default models; name models or a set, not both")
    if args.models:
        jobs = [(path, _inputs_for(path, args, console)) for path in args.models]
    else:
        model_set = args.model_set or ("fixtures" if args.quick else "all")
        jobs = []
        if model_set in ("all", "fixtures"):
            jobs += [(path, _inputs_for(path, args, console)) for path in _default_models(console)]
        if model_set in ("all", "medium"):
            jobs += _medium_jobs(console)
    rows = []
    for index, (path, inputs) in enumerate(jobs, 1):
        with console.status(f"timing {path} ({index} of {len(jobs)}) ..."):
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


def _medium_jobs(console) -> list[tuple[str, dict[str, np.ndarray]]]:
    """The checkout's medium transformers (built and cached on first use) at each of their shapes.

    Raises:
      CliError: no bench/medium_transformers.py next to this installation (an installed wheel).
    """
    script = ROOT / "bench" / "medium_transformers.py"
    if not script.exists():
        raise CliError(f"the medium transformers are made by {script.relative_to(ROOT)} of a clone of the "
                       "repository; run from a clone, or use --set fixtures, or name models")
    spec = importlib.util.spec_from_file_location("medium_transformers", script)
    medium = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = medium  # dataclasses resolve the module by name
    spec.loader.exec_module(medium)
    jobs = []
    for kind in medium.KINDS:
        with console.status(f"building {kind} (cached in {medium.MODELS}) ..."):
            path = str(medium.ensure(kind))
        jobs += [(path, medium.inputs(kind, batch, seq)) for batch, seq in medium.SHAPES]
    return jobs


def _default_models(console) -> list[str]:
    """The checkout's transformer fixtures; in an installed wheel (no tests/), the bundled tiny Llama, said."""
    fixtures = [ROOT / "tests" / "data" / f"{name}.onnx" for name in FIXTURES]
    if all(f.exists() for f in fixtures):
        return [str(f) for f in fixtures]
    bundled = demo_model_path()
    console.print(f"note: no tests/data fixtures next to this installation; timing the bundled {bundled.name} only "
                  "(run from a clone for all three, or name models)", markup=False)
    return [str(bundled)]


def _inputs_for(path: str, args: argparse.Namespace, console) -> dict[str, np.ndarray]:
    """``MODEL.inputs.npz`` when it exists, else random inputs for the model's declared types."""
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
