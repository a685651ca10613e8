"""Repeated layers unrolled vs one lax.scan: compile time and per-call time by depth.

For each model: translate with ``scan_layers=False`` and ``True``, then time
tracing+lowering and XLA's compile of the program separately (jax's
``lower``/``compile``), check the two give the same outputs, and time calls
(median and interquartile range; the two forms alternate call by call so
machine load hits both alike). Prints a markdown table.

    python bench/bench_scan.py                     # bench/tiny_transformer.py at 2, 8, 32 layers
    python bench/bench_scan.py --layers 2 4 8 16   # other depths
    python bench/bench_scan.py deep_llama.onnx     # any ONNX file(s); random inputs, --dim NAME=INT for symbolic dims
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402

import onnx2jax  # noqa: E402
from tiny_transformer import tiny_transformer  # noqa: E402


def _inputs(model: onnx2jax.JaxModel, dims: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = {}
    for info in model.inputs:
        shape = tuple(d if isinstance(d, int) and d > 0 else dims.get(str(d), 2 if d == "batch" else 16) for d in info.shape)
        if info.dtype.kind == "f":
            values[info.name] = rng.standard_normal(shape).astype(info.dtype)
        else:
            values[info.name] = rng.integers(0, dims.get("vocab", 64), shape).astype(info.dtype)
    return values


def _compile_times(model: onnx2jax.JaxModel, inputs: dict[str, np.ndarray]) -> tuple[float, float]:
    """(trace + lower, XLA compile) seconds of the program ``model(**inputs)`` runs."""
    program = model._program(())
    with jax.enable_x64(model.uses_64bit):
        start = time.perf_counter()
        lowered = program.lower(model._runtime_params(), inputs)
        traced = time.perf_counter()
        lowered.compile()
        compiled = time.perf_counter()
    return traced - start, compiled - traced


def bench(label: str, proto: onnx.ModelProto, dims: dict[str, int], repeats: int) -> str:
    forms = {}
    for scan in (False, True):
        start = time.perf_counter()
        try:
            model = onnx2jax.translate(proto, scan_layers=scan)
        except onnx2jax.NodeError as err:
            print(f"{label}: no scan: {err}", file=sys.stderr)
            continue
        load = time.perf_counter() - start
        inputs = _inputs(model, dims, seed=0)
        trace, xla = _compile_times(model, inputs)
        forms[scan] = (model, inputs, load, trace, xla)
    if True not in forms:
        return f"| {label} | (no repeated layer) | | | | | |"
    (unrolled, inputs, *_), (scanned, *_) = forms[False], forms[True]
    a, b = unrolled(**inputs), scanned(**inputs)
    diff = max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) for x, y in zip(a, b))
    times = {False: [], True: []}
    for _ in range(repeats):
        for scan in (False, True):
            model = forms[scan][0]
            start = time.perf_counter()
            jax.block_until_ready(model._call((), inputs))
            times[scan].append(time.perf_counter() - start)

    def cell(scan: bool) -> str:
        _, _, load, trace, xla = forms[scan]
        q = statistics.quantiles(times[scan], n=4)
        return f"{load:.2f} + {trace:.2f} + {xla:.2f} = {load + trace + xla:.2f} s | {statistics.median(times[scan]) * 1e3:.2f} ms ({q[0] * 1e3:.2f}–{q[2] * 1e3:.2f})"

    return f"| {label} | {cell(False)} | {cell(True)} | {diff:.1e} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="ONNX files (default: bench/tiny_transformer.py at --layers)")
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--repeats", type=int, default=100, help="calls timed per form (default 100)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT", help="a symbolic dim's size (default batch 2, others 16)")
    args = parser.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    cases = [(path, onnx.load(path)) for path in args.models] or [
        (f"tiny_transformer {n} layers", tiny_transformer(n)) for n in args.layers
    ]
    # Warm-up: the first trace in a process pays for imports and jax's own setup; time neither form with it.
    warm = onnx2jax.translate(cases[0][1], scan_layers=False)
    warm(**_inputs(warm, dims, seed=0))
    print(f"jax {jax.__version__}, {jax.default_backend()}, {os.cpu_count()} cpus; load average {os.getloadavg()[0]:.1f}")
    print()
    print("| model | unrolled: load + trace + XLA compile | unrolled: per call, median (IQR) | scan: load + trace + XLA compile | scan: per call, median (IQR) | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, proto in cases:
        print(bench(label, proto, dims, args.repeats), flush=True)
    print()
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
