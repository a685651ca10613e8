"""The zoo sharded with the Megatron plan: collectives and parameter bytes per device.

For each model of tests/data/zoo (scripts/make_zoo.py), applies `megatron_plan`
at the tensor-parallel degree the zoo tests use, compiles it on 8 fake CPU
devices, runs the stored inputs, and prints a Markdown table: the TP degree,
the collectives of the compiled program (all-reduce / all-gather / others),
the analytic minimum, the largest parameter bytes on one device against the
unsharded total, and the largest difference from onnxruntime's stored outputs.

    python bench/zoo_table.py            # every model
    python bench/zoo_table.py qwen2 t5   # some
"""

from __future__ import annotations

import os
import pathlib
import sys
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "onnx2jax"))

import onnx2jax  # noqa: E402
from sharding.megatron import megatron_plan  # noqa: E402
from zoo_cases import CASES, ZOO  # noqa: E402


def measure(name: str) -> dict:
    case = CASES[name]
    model = onnx.load(ZOO / f"{name}.onnx")
    annotated = megatron_plan(model, case.tp) if case.tp > 1 else model
    compiled = onnx2jax.compile(annotated)  # unannotated (no plan): runs on one device
    inputs = dict(np.load(ZOO / f"{name}.inputs.npz"))
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    start = time.perf_counter()
    outputs = compiled(**inputs)
    seconds = time.perf_counter() - start
    error = max(
        float(np.abs(np.asarray(v, np.float64) - reference[n]).max())
        for n, v in zip(compiled.model.output_names, outputs)
    )
    report = compiled.report()
    return dict(
        name=name,
        tp=case.tp,
        collectives=report.collectives,
        minimum=case.minimum,
        bytes_max=max(report.param_bytes_per_device.values()),
        bytes_total=report.param_bytes_total,
        error=error,
        seconds=seconds,
    )


def row(m: dict) -> str:
    c = dict(m["collectives"])
    found = f"{c.pop('all-reduce', 0)} AR + {c.pop('all-gather', 0)} AG"
    others = sum(c.values())
    if others:
        found += f" + {others} other (" + ", ".join(f"{k} {v}" for k, v in c.items() if v) + ")"
    minimum = f"{m['minimum'][0]} AR + {m['minimum'][1]} AG"
    if m["tp"] == 1:
        return (f"| {m['name']} | no plan | – | – | – | {m['bytes_max']:,} | {m['bytes_total']:,} | "
                f"{m['error']:.1e} |")
    ok = "yes" if m["collectives"].get("all-reduce", 0) == m["minimum"][0] and \
        m["collectives"].get("all-gather", 0) == m["minimum"][1] and not others else "**no**"
    return (f"| {m['name']} | {m['tp']} | {found} | {minimum} | {ok} | {m['bytes_max']:,} | "
            f"{m['bytes_total']:,} | {m['error']:.1e} |")


def main(argv: list[str]) -> int:
    names = argv or list(CASES)
    print("| model | TP | collectives | minimum | at minimum | param bytes / device (max) "
          "| unsharded | max \\|Δ\\| vs onnxruntime |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in names:
        try:
            print(row(measure(name)), flush=True)
        except Exception as e:  # noqa: BLE001 - a table row per model, failures included
            print(f"| {name} | {CASES[name].tp} | error: {type(e).__name__}: "
                  f"{str(e).splitlines()[0][:120]} | | | | | |", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("XLA_FLAGS", "")
    sys.exit(main(sys.argv[1:]))
