"""onnx2jax (jitted, after warm-up) against onnxruntime (CPU) on the same fixtures, in one process.

Prints one row per model and input shape: the median time of each (the two
measured alternately, so that machine noise hits both alike) and their
ratio (onnx2jax / onnxruntime; below 1 means onnx2jax is faster), and writes
the table to bench/results/vs_onnxruntime.md.

    python bench/bench_vs_onnxruntime.py [--repeats 50] [--batch 4 --seq 64]
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import statistics
import time

import jax
import numpy as np
import onnxruntime as ort

import onnx2jax

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ["tiny_llama", "tiny_gpt2", "tiny_bert"]


def _inputs(model: onnx2jax.JaxModel, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, 256, (batch, seq)).astype(np.int64)}
    if "attention_mask" in model.input_names:
        inputs["attention_mask"] = np.ones((batch, seq), np.int64)
    return inputs


def _median_seconds(ours, theirs, repeats: int) -> tuple[float, float]:
    """Median times of two callables, measured alternately so that machine noise hits both alike."""
    ours(), theirs()  # warm-up: compile / session initialisation
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, bucket in ((ours, times[0]), (theirs, times[1])):
            start = time.perf_counter()
            fn()
            bucket.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    rows = []
    for name in FIXTURES:
        path = ROOT / "tests" / "data" / f"{name}.onnx"
        model = onnx2jax.translate(path)
        inputs = _inputs(model, args.batch, args.seq)
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        ours, theirs = _median_seconds(
            lambda: jax.block_until_ready(model(**inputs)), lambda: session.run(None, inputs), args.repeats
        )
        rows.append((name, f"{args.batch}x{args.seq}", ours * 1e3, theirs * 1e3, ours / theirs))
    header = "| model | input | onnx2jax ms | onnxruntime ms | ratio |\n|---|---|---|---|---|"
    lines = [f"| {n} | {s} | {a:.3f} | {b:.3f} | {r:.2f} |" for n, s, a, b, r in rows]
    device = jax.devices()[0].device_kind
    table = "\n".join([header, *lines])
    note = (
        f"\n\nMedian of {args.repeats} alternating runs after warm-up; jax {jax.__version__} on {device}, "
        f"onnxruntime {ort.__version__} CPUExecutionProvider; {platform.processor() or platform.machine()}, "
        f"{jax.local_device_count()} jax device(s).\n"
    )
    print(table + note)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "vs_onnxruntime.md").write_text(table + note)


if __name__ == "__main__":
    main()
