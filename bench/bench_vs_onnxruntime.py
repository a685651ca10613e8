"""onnx2jax (jitted, after warm-up) against onnxruntime (CPU) on the same fixtures, in one process.

Prints one row per model and input shape: the median time of each (the two
measured alternately, so that machine noise hits both alike) and their
ratio (onnx2jax / onnxruntime; below 1 means onnx2jax is faster), and writes
the table to bench/results/vs_onnxruntime.md.

With ``--tiny 2,8,32`` it also times tiny transformer exports of those depths
(bench/tiny_transformer.py: width 64, batch 2 x 16) per call, and the first
call of a fresh process (load, trace, compile, run; session creation and run
for onnxruntime) with JAX's persistent compilation cache cold and then warm.

    python bench/bench_vs_onnxruntime.py [--repeats 50] [--batch 4 --seq 64] [--tiny 2,8,32]
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

import jax
import numpy as np
import onnxruntime as ort

import onnx2jax
from onnx2jax.benchmark import alternate

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ["tiny_llama", "tiny_gpt2", "tiny_bert"]


def _inputs(model: onnx2jax.JaxModel, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {"input_ids": rng.integers(0, 256, (batch, seq)).astype(np.int64)}
    if "attention_mask" in model.input_names:
        inputs["attention_mask"] = np.ones((batch, seq), np.int64)
    return inputs


def _session(path: str) -> ort.InferenceSession:
    """onnxruntime's CPU session with its idle intra-op threads not spinning.

    By default they busy-wait after each run; on a 2-core machine that starves
    the call timed next (XLA's threads): 2-layer tiny transformer 7.3 ms per
    onnx2jax call with spinning, 1.1 ms without (onnxruntime 0.63 -> 0.78 ms).
    """
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _median_seconds(ours, theirs, repeats: int) -> tuple[float, float]:
    """Median times of two callables after one warm-up call each, measured alternately (onnx2jax.benchmark)."""
    times = alternate(ours, theirs, repeats, warmup=1)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--tiny", default="", metavar="2,8,32", help="also tiny transformers of these depths")
    args = parser.parse_args()
    rows = []
    for name in FIXTURES:
        path = ROOT / "tests" / "data" / f"{name}.onnx"
        model = onnx2jax.translate(path)
        inputs = _inputs(model, args.batch, args.seq)
        session = _session(str(path))
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
        f"onnxruntime {ort.__version__} CPUExecutionProvider (intra-op spinning off); {platform.processor() or platform.machine()}, "
        f"{jax.local_device_count()} jax device(s).\n"
    )
    print(table + note)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "vs_onnxruntime.md").write_text(table + note)
    if args.tiny:
        tiny = _tiny_tables([int(n) for n in args.tiny.split(",")], args.repeats)
        print(tiny)
        (out / "tiny_transformers.md").write_text(tiny + note)


_FIRST_CALL = """
import sys, time
start = time.perf_counter()
path, runtime, cache = sys.argv[1], sys.argv[2], sys.argv[3]
import numpy as np
x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
if runtime == "onnxruntime":
    import onnxruntime as ort
    ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
else:
    import jax, onnx2jax
    if cache:
        import onnx2jax.runtime.compilation_cache
        onnx2jax.runtime.compilation_cache.enable(cache)
    jax.block_until_ready(onnx2jax.translate(path)(x))
print(time.perf_counter() - start)
"""


def _first_call(path: str, runtime: str, cache: str = "") -> float:
    """Seconds from the start of a fresh process's work (imports included) to its first outputs."""
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL, path, runtime, cache], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return float(done.stdout.strip().splitlines()[-1])


def _tiny_tables(depths: list[int], repeats: int) -> str:
    """Per-call and first-call tables for tiny transformers of the given depths."""
    sys.path.insert(0, str(ROOT / "bench"))
    from tiny_transformer import tiny_transformer

    import onnx

    per_call, first = [], []
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        for layers in depths:
            path = f"{tmp}/tiny_{layers}.onnx"
            onnx.save(tiny_transformer(layers), path)
            model = onnx2jax.translate(path)
            session = _session(path)
            ours, theirs = _median_seconds(
                lambda: jax.block_until_ready(model(x)), lambda: session.run(None, {"x": x}), repeats
            )
            per_call.append(f"| {layers} | {ours * 1e3:.3f} | {theirs * 1e3:.3f} | {ours / theirs:.2f} |")
            cache = f"{tmp}/cache_{layers}"
            cold, warm = _first_call(path, "onnx2jax", cache), _first_call(path, "onnx2jax", cache)
            no_cache, reference = _first_call(path, "onnx2jax"), _first_call(path, "onnxruntime")
            first.append(f"| {layers} | {no_cache:.2f} | {cold:.2f} | {warm:.2f} | {reference:.2f} |")
    return "\n".join(
        [
            "Tiny transformers (width 64, batch 2 x 16), per call:\n",
            "| layers | onnx2jax ms | onnxruntime ms | ratio |",
            "|---|---|---|---|",
            *per_call,
            "\nFirst call in a fresh process, imports included (seconds):\n",
            "| layers | onnx2jax, no cache | onnx2jax, cache cold | onnx2jax, cache warm | onnxruntime |",
            "|---|---|---|---|---|",
            *first,
        ]
    )


if __name__ == "__main__":
    main()
