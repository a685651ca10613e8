"""Where a fresh process's first call goes: imports, translate, trace, lower, compile or cache load, run.

For each tiny transformer depth (``bench/tiny_transformer.py``, width 64,
input [2, 16, 64]) and ``--repeats`` rounds, fresh processes in turn:
onnxruntime (import, session creation, first run); onnx2jax without the
persistent compilation cache; with it cold (an empty folder); with it warm
(the folder the cold run filled). Each onnx2jax process times its phases
(``import jax``, ``import onnx2jax``, ``translate``, trace, lower, XLA
compile or cache load, first run of the compiled program); "interpreter" is
the process's wall time before the script's first line (Python start-up).
Prints medians, with the interquartile range of the total, and the load
average at the end of each row.

    python bench/bench_startup.py [--layers 2,8,32] [--repeats 3] [--output bench/results/startup.md]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]

_ONNX2JAX = """
import sys, time, json
t0 = time.perf_counter()
path, cache = sys.argv[1], sys.argv[2]
import numpy as np
import jax
t1 = time.perf_counter()
import onnx2jax
if cache:
    import onnx2jax.runtime.compilation_cache
    onnx2jax.runtime.compilation_cache.enable(cache)
t2 = time.perf_counter()
x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
model = onnx2jax.translate(path)
t3 = time.perf_counter()
with jax.enable_x64(model.uses_64bit):  # what model(x) does, phase by phase
    traced = model._program(()).trace(model._runtime_params(), {"x": x})
    t4 = time.perf_counter()
    lowered = traced.lower()
    t5 = time.perf_counter()
    executable = lowered.compile()
    t6 = time.perf_counter()
    jax.block_until_ready(executable(model._runtime_params(), {"x": x}))
t7 = time.perf_counter()
print(json.dumps({"import jax": t1 - t0, "import onnx2jax": t2 - t1, "translate": t3 - t2, "trace": t4 - t3,
                  "lower": t5 - t4, "compile": t6 - t5, "run": t7 - t6, "script": t7 - t0}))
"""

_ONNXRUNTIME = """
import sys, time, json
t0 = time.perf_counter()
import numpy as np
import onnxruntime as ort
t1 = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
t2 = time.perf_counter()
session.run(None, {"x": np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)})
t3 = time.perf_counter()
print(json.dumps({"import onnxruntime": t1 - t0, "session": t2 - t1, "run": t3 - t2, "script": t3 - t0}))
"""


def _process(code: str, *args: str) -> dict[str, float]:
    """One fresh process's phases; 'interpreter' is its wall time outside the script, 'total' all of it."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - start
    phases = json.loads(done.stdout.strip().splitlines()[-1])
    phases["interpreter"] = wall - phases.pop("script")
    phases["total"] = wall
    return phases


def _row(label: str, runs: list[dict[str, float]], columns: tuple[str, ...]) -> str:
    cells = []
    for column in columns:
        values = [r[column] for r in runs if column in r]
        cells.append(f"{np.median(values):.2f}" if values else "-")
    q1, q3 = np.percentile([r["total"] for r in runs], [25, 75])
    return f"| {label} | {' | '.join(cells)} | {q3 - q1:.2f} | {os.getloadavg()[0]:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "startup.md"))
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "bench"))
    import onnx
    from tiny_transformer import tiny_transformer

    columns = ("interpreter", "import jax", "import onnx2jax", "translate", "trace", "lower", "compile", "run", "total")
    lines = [f"| model, runtime | {' | '.join(columns)} | total IQR | load average |", "|---" * (len(columns) + 3) + "|"]
    ort_lines = ["| model | interpreter | import onnxruntime | session | run | total | total IQR | load average |",
                 "|---" * 8 + "|"]
    with tempfile.TemporaryDirectory() as tmp:
        for layers in (int(n) for n in args.layers.split(",")):
            path = f"{tmp}/tiny_{layers}.onnx"
            onnx.save(tiny_transformer(layers), path)
            runs: dict[str, list[dict[str, float]]] = {"no cache": [], "cache cold": [], "cache warm": [], "ort": []}
            for round_ in range(args.repeats):
                cache = f"{tmp}/cache_{layers}_{round_}"
                runs["ort"].append(_process(_ONNXRUNTIME, path))
                runs["no cache"].append(_process(_ONNX2JAX, path, ""))
                runs["cache cold"].append(_process(_ONNX2JAX, path, cache))
                runs["cache warm"].append(_process(_ONNX2JAX, path, cache))
            for mode in ("no cache", "cache cold", "cache warm"):
                lines.append(_row(f"{layers} layers, onnx2jax {mode}", runs[mode], columns))
                print(lines[-1], flush=True)
            ort_lines.append(_row(f"{layers} layers", runs["ort"], ("interpreter", "import onnxruntime", "session", "run", "total")))
            print(ort_lines[-1], flush=True)
    note = (f"\nSeconds, median of {args.repeats} fresh processes per row; 'compile' is XLA's compile, or the "
            "executable's load from the persistent cache when warm; 'run' the first execution.\n")
    text = "\n".join(lines) + "\n\n" + "\n".join(ort_lines) + "\n" + note
    print(text)
    pathlib.Path(args.output).parent.mkdir(exist_ok=True)
    pathlib.Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
