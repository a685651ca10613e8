"""The tiny Llama with the Megatron plan on 1/2/4/8 fake CPU devices: collectives, bytes, compile time.

For each tensor-parallel degree N: the all-reduces (and other collectives) of
the compiled program read from its HLO, with the bytes they move, against the
analytic minimum of Megatron tensor parallelism for this model (one
all-reduce of the [batch, seq, hidden] activations after each row-parallel
projection, two per layer, and one after the vocabulary-split embedding; the
logits stay split over the vocabulary); the largest parameter bytes on one
device against total / N; and the time of the first call (annotate + trace +
partition + compile + run). The sharded logits are checked against the
unsharded run.

    python bench/bench_sharded.py [--output bench/results/sharded.md]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime.spmd import count_collectives  # noqa: E402
from sharding.megatron import megatron_plan  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "data" / "tiny_llama.onnx"
LAYERS, HIDDEN = 2, 64  # tests/data/README.md: tiny_llama
_DTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "s64": 8, "s32": 4, "pred": 1}


def all_reduce_bytes(hlo_text: str) -> int:
    """Bytes of the results of the all-reduces in compiled HLO text (async start counted once)."""
    total = 0
    for dtype, dims in re.findall(r"=\s*(\w+)\[([\d,]*)\][^=\n]*?\ball-reduce(?:-start)?\(", hlo_text):
        total += _DTYPE_BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "sharded.md"))
    args = parser.parse_args()
    model = onnx.load(str(MODEL))
    ids = np.load(MODEL.with_suffix(".inputs.npz"))["input_ids"]
    batch, seq = ids.shape
    (reference,) = onnx2jax.translate(model)(ids)
    activation = batch * seq * HIDDEN * 4
    rows = []
    for n in (1, 2, 4, 8):
        start = time.perf_counter()
        compiled = onnx2jax.compile(megatron_plan(model, n))
        (logits,) = compiled(ids)
        jax.block_until_ready(logits)
        seconds = time.perf_counter() - start
        text = compiled.compiled_text(ids)
        counts = count_collectives(text)
        report = compiled.report(ids)
        most = max(report.param_bytes_per_device.values())
        minimum = 0 if n == 1 else 2 * LAYERS + 1
        diff = float(np.max(np.abs(np.asarray(logits) - np.asarray(reference))))
        others = ", ".join(f"{k} {v}" for k, v in counts.items() if k != "all-reduce" and v) or "none"
        rows.append(
            f"| {n} | {counts['all-reduce']} | {minimum} | {all_reduce_bytes(text)} | {minimum * activation} | {others} "
            f"| {most} | {report.param_bytes_total / n:.0f} | {most * n / report.param_bytes_total:.2f} "
            f"| {seconds:.2f} | {diff:.2g} |"
        )
    header = (
        "| devices N | all-reduces | minimum | all-reduce bytes | minimum bytes | other collectives "
        "| max param bytes/device | total/N | ratio to 1/N | first call s | max abs diff vs unsharded |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    note = (
        f"\n\ntiny_llama ({LAYERS} layers, hidden {HIDDEN}, input_ids {list(ids.shape)}), Megatron plan "
        f"(GQA K/V replicated where the KV heads do not split), {jax.device_count()} fake CPU devices in one "
        f"process; jax {jax.__version__}, {os.cpu_count()} CPU(s). Bytes are per device (all-reduce results); "
        "first call = compile(annotated model) + trace + partition + XLA compile + run."
    )
    table = "\n".join([header, *rows]) + note + "\n"
    print(table)
    pathlib.Path(args.output).write_text(table)


if __name__ == "__main__":
    main()
