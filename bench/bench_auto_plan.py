"""Automatic plans (issue 31): search time, and predicted vs measured step time of the top candidates.

1. Search time of `sharding.auto_plan` on synthetic 32-layer transformers (bench/medium_transformers.py
   graphs at a small width: the search reads shapes and specs, never weights, so its time is set by
   the node count, not the width) at 8 and 256 devices: the wall time of the whole search (one shape
   inference, every candidate's inference, writing the winner), best of 3.
2. For zoo models on 8 fake CPU devices: every candidate of the report that inference accepts (top 4
   by predicted time, and the hand plan), compiled and timed (best of 30 calls after a warm-up: the machine is shared, and the best is the
   least disturbed), next
   to its predicted time at this backend's calibrated rates. Fake CPU devices share the host's cores, so
   the measured times are the CPU emulation's; the ratio column says how far the model is off here.

3. With ``--zoo``: every zoo model at 2/4/8 devices (batch 2), the automatic plan and the hand plan
   (`megatron_plan` given the batch) compiled: their measured collectives, collective bytes and
   parameter bytes per device (what tests/onnx2jax/test_auto_plans.py asserts).

    python bench/bench_auto_plan.py [--zoo] [--output bench/results/auto_plan.md]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import medium_transformers  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime.auto_check import measured  # noqa: E402
from onnx2jax.runtime.calibration import rates as backend_rates  # noqa: E402
from sharding.auto import auto_plan  # noqa: E402
from sharding.auto.analysis import write_plan, PlanAnalysis  # noqa: E402
from sharding.auto.candidates import candidates, hand_plan  # noqa: E402
from sharding.stage_cut import declared_shapes  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests" / "data" / "zoo"


def search_times() -> list[str]:
    lines = ["| model | nodes | devices | layouts weighed | winner | search (s, best of 3) |", "|---|---|---|---|---|---|"]
    config = medium_transformers.Config(layers=32, width=128, heads=8, kv_heads=2, ffn=256, llama_ffn=256,
                                        vocab=512, positions=256)
    for kind in ("llama_gqa", "gpt2"):
        model = medium_transformers.build(kind, config)
        for devices in (8, 256):
            best, report = None, None
            for _ in range(3):
                start = time.perf_counter()
                _, report = auto_plan(model, devices, batch=devices if devices <= 8 else 8, seq=128)
                took = time.perf_counter() - start
                best = took if best is None else min(best, took)
            lines.append(f"| {kind} 32 layers | {len(model.graph.node)} | {devices} | {len(report.rows)} | "
                         f"{report.winner.name} | {best:.2f} |")
    return lines


def _time(compiled, inputs, calls: int = 30) -> float:
    jax.block_until_ready(compiled(**inputs))
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(compiled(**inputs))
        times.append(time.perf_counter() - start)
    return min(times)


def predicted_vs_measured(name: str, devices: int, batch: int, rates) -> list[str]:
    model = onnx.load(ZOO / f"{name}.onnx")
    base = dict(np.load(ZOO / f"{name}.inputs.npz"))
    inputs = {k: np.concatenate([v] * (batch // v.shape[0])) for k, v in base.items()}
    seq = max(v.shape[1] for v in inputs.values() if v.ndim > 1)
    _, report = auto_plan(model, devices, batch=batch, seq=seq, rates=rates, memory_per_device=10**9)
    analysis = PlanAnalysis(model, declared_shapes(model, batch, seq))
    by_name = {c.name: c for c in candidates(analysis, devices, batch)}
    hand = hand_plan(analysis, devices, batch)
    by_name[hand.name] = hand
    rows = [r for r in report.rows if not r.errors][:4] + [report.hand]
    lines = [f"\n{name}, {devices} devices, batch {batch} (memory limit lifted: every layout is timed)\n",
             "| candidate | predicted (us) | measured (us) | measured / predicted | collectives (HLO) | "
             "collective bytes predicted / measured |", "|---|---|---|---|---|---|"]
    for row in rows:
        annotated = write_plan(analysis, by_name[row.name].written, devices)
        compiled = onnx2jax.compile(annotated)
        seconds = _time(compiled, inputs)
        m = measured(compiled.compiled_text(**inputs), compiled.report(**inputs).param_bytes_per_device)
        counts = ", ".join(f"{v} {k}" for k, v in m["collectives"].items() if v) or "none"
        lines.append(f"| {row.name} | {row.seconds * 1e6:,.0f} | {seconds * 1e6:,.0f} | {seconds / row.seconds:.2f} | "
                     f"{counts} | {row.collective_bytes:,} / {m['collective_bytes']:,} |")
    return lines


def zoo_table() -> list[str]:
    from onnx2jax.runtime.auto_check import check
    from sharding.megatron import megatron_plan

    lines = ["| model | devices | automatic plan | collectives auto / hand | collective bytes auto / hand | "
             "parameter bytes per device auto / hand | search (s) |", "|---|---|---|---|---|---|---|"]
    for path in sorted(ZOO.glob("*.onnx")):
        name = path.stem
        model = onnx.load(path)
        inputs = dict(np.load(ZOO / f"{name}.inputs.npz"))
        seq = max(v.shape[1] for v in inputs.values() if v.ndim > 1)
        for devices in (2, 4, 8):
            start = time.perf_counter()
            annotated, report = auto_plan(model, devices, batch=2, seq=seq)
            took = time.perf_counter() - start
            compiled = onnx2jax.compile(annotated)
            check(compiled, report, inputs)
            hand = onnx2jax.compile(megatron_plan(model, devices, batch=2))
            ours = measured(hand.compiled_text(**inputs), hand.report(**inputs).param_bytes_per_device)
            auto = report.measured

            def counts(m):
                return ", ".join(f"{v} {k}" for k, v in m["collectives"].items() if v) or "none"

            lines.append(f"| {name} | {devices} | {report.winner.name} | {counts(auto)} / {counts(ours)} | "
                         f"{auto['collective_bytes']:,} / {ours['collective_bytes']:,} | "
                         f"{auto['param_bytes']:,} / {ours['param_bytes']:,} | {took:.2f} |")
            print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output", type=pathlib.Path)
    parser.add_argument("--zoo", action="store_true", help="only the zoo table (auto vs hand plan, compiled)")
    args = parser.parse_args()
    if args.zoo:
        text = "\n".join(zoo_table()) + "\n"
        if args.output:
            args.output.write_text(text)
        return
    rates = backend_rates(jax.devices(), refresh=True)
    lines = ["## Search time", "", *search_times(), "",
             "## Predicted vs measured step time (8 fake CPU devices)", "", f"rates: {rates.source}: "
             + ", ".join(f"{k} {rates.latency[k] * 1e6:.0f} us + {rates.bandwidth[k] / 1e9:.2f} GB/s"
                         for k in ("all-reduce", "all-gather"))
             + f"; {rates.flops / 1e9:.1f} GFLOP/s per device; {rates.overhead * 1e6:.0f} us per call"]
    for name, devices, batch in (("gpt2", 8, 8), ("resnet", 8, 8), ("vit", 8, 8)):
        lines += predicted_vs_measured(name, devices, batch, rates)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
