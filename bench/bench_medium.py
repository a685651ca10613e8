"""Medium transformers per call: onnx2jax against onnxruntime and a hand-written flax NNX Llama, one process.

The models are bench/medium_transformers.py's (6 layers, width 512,
vocabulary 8,192; built and cached in bench/models/ on first use), at batch x
sequence 1 x 128 and 8 x 256. Per model and shape the runtimes are called in
turn (onnx2jax, onnxruntime, and for the Llama the flax NNX model of
bench/flax_llama.py with the same weights, jitted) so that the noise of a
shared machine hits all alike; the table gives each one's median and
interquartile range, the ratios of the medians and the largest difference of
the outputs from onnxruntime's, then the geometric means of the ratios. Each
call's process CPU time (all threads) is recorded too: on a machine shared
with other processes the wall time is mostly waiting for a core, the CPU time
is the work. The load average (``os.getloadavg``) before and after is printed
with it.

    python bench/bench_medium.py [--repeats 30] [--kinds llama_gqa,gpt2,bert] [--scan-layers off] [--hlo DIR]

``--hlo DIR`` also writes the optimized HLO of each jitted program
(onnx2jax and flax) for reading, one file per model and shape.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import jax
import numpy as np
import onnx
import onnxruntime as ort

import onnx2jax
from onnx2jax.benchmark import alternate_all, iqr

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import medium_transformers as mt  # noqa: E402  (bench/ is not a package)


def _session(path: str) -> ort.InferenceSession:
    """onnxruntime on the CPU with its idle intra-op threads not spinning (they starve the next runtime)."""
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _write_hlo(folder: pathlib.Path, stem: str, jitted, *args) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.hlo.txt").write_text(jitted.lower(*args).compile().as_text())


def _cpu_timed(fn, bucket: list[float]):
    """``fn``, appending the process CPU time (seconds, all threads) of each call to ``bucket``."""

    def timed():
        start = time.process_time()
        fn()
        bucket.append(time.process_time() - start)

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--kinds", default=",".join(mt.KINDS))
    parser.add_argument("--shapes", default="1x128,8x256")
    parser.add_argument("--scan-layers", choices=("auto", "on", "off"), default="auto",
                        help="onnx2jax.translate's scan_layers (default auto: the 6 layers run as one lax.scan)")
    parser.add_argument("--hlo", metavar="DIR", help="write each jitted program's optimized HLO here")
    parser.add_argument("--output", default=str(pathlib.Path(__file__).resolve().parent / "results" / "medium.md"))
    args = parser.parse_args()
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    load_before = os.getloadavg()
    rows, vs_ort, vs_flax, cpu_vs_ort, cpu_vs_flax = [], [], [], [], []
    for kind in args.kinds.split(","):
        path = str(mt.ensure(kind))
        model = onnx2jax.translate(path, scan_layers={"auto": "auto", "on": True, "off": False}[args.scan_layers])
        session = _session(path)
        flax_run = None
        if kind == "llama_gqa":
            from flax_llama import FlaxLlama, jitted

            forward, state = jitted(FlaxLlama.from_onnx(onnx.load(path), mt.MEDIUM))
            flax_run = lambda ids: forward(state, ids)  # noqa: E731
        for batch, seq in shapes:
            inputs = mt.inputs(kind, batch, seq)
            ids = jax.device_put(inputs["input_ids"])
            fns = [lambda: jax.block_until_ready(model(**inputs)), lambda: session.run(None, inputs)]
            if flax_run is not None:
                fns.append(lambda: jax.block_until_ready(flax_run(ids)))
            reference = session.run(None, inputs)[0]
            diffs = [float(np.max(np.abs(np.asarray(model(**inputs)[0]) - reference)))]
            if flax_run is not None:
                diffs.append(float(np.max(np.abs(np.asarray(flax_run(ids)) - reference))))
            if args.hlo:
                folder = pathlib.Path(args.hlo)
                with jax.enable_x64(True):
                    _write_hlo(folder, f"{kind}_{batch}x{seq}_onnx2jax", model._program(()), model._runtime_params(),
                               inputs)
                if flax_run is not None:
                    _write_hlo(folder, f"{kind}_{batch}x{seq}_flax", forward, state, ids)
            cpu: list[list[float]] = [[] for _ in fns]
            times = alternate_all([_cpu_timed(fn, bucket) for fn, bucket in zip(fns, cpu)], args.repeats, args.warmup)
            cpu_medians = [statistics.median(c[args.warmup:]) * 1e3 for c in cpu]
            medians = [statistics.median(t) * 1e3 for t in times]
            spreads = [iqr(t) * 1e3 for t in times]
            ratio_ort = medians[0] / medians[1]
            cpu_vs_ort.append(cpu_medians[0] / cpu_medians[1])
            if flax_run is not None:
                cpu_vs_flax.append(cpu_medians[0] / cpu_medians[2])
            vs_ort.append(ratio_ort)
            cells = [kind, f"{batch}x{seq}", f"{medians[0]:.2f}", f"{spreads[0]:.2f}", f"{medians[1]:.2f}",
                     f"{spreads[1]:.2f}"]
            if flax_run is not None:
                vs_flax.append(medians[0] / medians[2])
                cells += [f"{medians[2]:.2f}", f"{spreads[2]:.2f}", f"{ratio_ort:.3f}", f"{medians[0] / medians[2]:.3f}"]
            else:
                cells += ["-", "-", f"{ratio_ort:.3f}", "-"]
            cells += [f"{cpu_medians[0]:.1f}", f"{cpu_medians[1]:.1f}", f"{cpu_medians[2]:.1f}" if flax_run else "-",
                      f"{diffs[0]:.1e}", f"{diffs[1]:.1e}" if len(diffs) > 1 else "-"]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    geo = lambda r: float(np.exp(np.mean(np.log(r)))) if r else float("nan")  # noqa: E731
    header = ("| model | batch x seq | onnx2jax ms | IQR | onnxruntime ms | IQR | flax NNX ms | IQR | "
              "onnx2jax / onnxruntime | onnx2jax / flax | CPU ms onnx2jax | CPU ms onnxruntime | CPU ms flax | "
              "max abs diff onnx2jax | max abs diff flax |\n"
              "|" + "---|" * 15)
    load_after = os.getloadavg()
    note = (
        f"\n\nGeometric mean of onnx2jax / onnxruntime: {geo(vs_ort):.3f} ({len(vs_ort)} rows); of onnx2jax / flax "
        f"NNX: {geo(vs_flax):.3f} ({len(vs_flax)} rows). In CPU time: {geo(cpu_vs_ort):.3f} and {geo(cpu_vs_flax):.3f}. Median and interquartile range (ms) of {args.repeats} "
        f"calls of each runtime in turn after {args.warmup} warm-up calls; CPU ms: median process CPU time "
        f"(all threads) per call, which other processes' load does not inflate; max abs diff against "
        f"onnxruntime's output. Load average (1, 5, 15 min) before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
        f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}; onnx2jax scan_layers={args.scan_layers}; jax {jax.__version__} "
        f"({jax.devices()[0].platform}), onnxruntime {ort.__version__} CPUExecutionProvider (spinning off), "
        f"{os.cpu_count()} CPU(s).\n"
    )
    table = header + "\n" + "\n".join(rows) + note
    print(table)
    pathlib.Path(args.output).parent.mkdir(exist_ok=True)
    pathlib.Path(args.output).write_text(table)


if __name__ == "__main__":
    main()
