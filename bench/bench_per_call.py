"""Where a small model's call goes: onnx2jax's Python, jit's dispatch, XLA CPU's runtime, against onnxruntime.

All in one process, the callables of a group called in a new random order in
each of ``--repeats`` rounds (so that a shared machine's noise, and what one
call leaves behind for the next, hit them alike), median and interquartile
range in microseconds:

* **floor**: one-op models ([2, 16, 64] float32 ``y = x * 2``): onnxruntime's
  ``session.run``; a jitted ``lambda x: x * 2`` called with the numpy array
  (jit's C++ dispatch, the host-to-device copy and XLA's smallest run); the
  same ONNX model through ``onnx2jax.translate``.
* **tiny transformers** (``bench/tiny_transformer.py``, 2/8/32 layers, batch
  2 x 16): onnxruntime; ``model(x)``; the model's ahead-of-time executable
  called directly (no onnx2jax Python at all); and that executable compiled
  with each per-executable XLA option of ``OPTIONS`` (an option XLA refuses
  is listed with its error).

    python bench/bench_per_call.py [--repeats 300] [--layers 2,8,32] [--output bench/results/per_call.md]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import random
import sys
import tempfile
import time
from collections.abc import Callable

import jax
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

import onnx2jax
from onnx2jax.xla_options import compiler_options

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from tiny_transformer import tiny_transformer  # noqa: E402

OPTIONS = {
    "thunk runtime off": {"xla_cpu_use_thunk_runtime": False},
    "Eigen single thread": {"xla_cpu_multi_thread_eigen": False},
    "concurrency scheduler off": {"xla_cpu_enable_concurrency_optimized_scheduler": False},
    "fusion emitters off": {"xla_cpu_use_fusion_emitters": False},
    "XNNPACK fusions off": {"xla_cpu_experimental_xnn_fusion_type": ""},
    "YNNPACK fusions off": {"xla_cpu_experimental_ynn_fusion_type": ""},
}
"""Per-executable XLA CPU options tried on top of onnx2jax's own (``onnx2jax.xla_options``)."""


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # see bench_vs_onnxruntime
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _times(calls: dict[str, Callable[[], object]], repeats: int, warmup: int = 20) -> dict[str, list[float]]:
    """Seconds per call of each callable: ``repeats`` rounds after ``warmup``, each round in a new random order.

    A fixed order would charge one callable for what the one before it left
    behind (onnxruntime's threads going to sleep, say) on every round.
    """
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    rng = random.Random(0)
    for _ in range(repeats):
        rng.shuffle(names)
        for name in names:
            start = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - start)
    return times


def _row(name: str, seconds: list[float], reference: list[float]) -> str:
    q1, median, q3 = np.percentile(np.asarray(seconds) * 1e6, [25, 50, 75])
    ratio = median / (np.median(reference) * 1e6)
    return f"| {name} | {median:.1f} | {q3 - q1:.1f} | {ratio:.2f} |"


def _table(title: str, times: dict[str, list[float]], reference: str) -> str:
    lines = [f"**{title}** ({os.popen('uptime').read().strip()})", "",
             f"| call | median µs | IQR µs | / {reference} |", "|---|---|---|---|"]
    lines += [_row(name, t, times[reference]) for name, t in times.items()]
    return "\n".join(lines)


def _mul_model() -> onnx.ModelProto:
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 16, 64]) for n in ("x", "y")]
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["y"])], "mul", [info[0]], [info[1]], [two])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def floor(repeats: int) -> str:
    """onnxruntime, a bare jitted function and onnx2jax on a one-op model."""
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    model = _mul_model()
    session = _session(model)
    bare = jax.jit(lambda v: v * 2)
    ours = onnx2jax.translate(model)
    calls = {
        "onnxruntime session.run": lambda: session.run(None, {"x": x}),
        "jax.jit(lambda x: x * 2)(numpy)": lambda: jax.block_until_ready(bare(x)),
        "onnx2jax model(x)": lambda: jax.block_until_ready(ours(x)),
    }
    return _table("One Mul, [2, 16, 64] float32", _times(calls, repeats), "onnxruntime session.run")


def _executable(model: onnx2jax.JaxModel, x: np.ndarray, options: dict) -> Callable[[], object]:
    """The model's program compiled ahead of time with ``options`` added, called directly."""
    names, baked = model._runtime_names, model._baked_params
    params = model._runtime_params()
    with jax.enable_x64(model.uses_64bit):
        jitted = jax.jit(
            lambda p, values: model.evaluate({**dict(zip(names, p)), **baked}, values),
            compiler_options={**compiler_options("cpu"), **options},
        )
        executable = jitted.lower(params, {"x": x}).compile()
    return lambda: jax.block_until_ready(executable(params, {"x": x}))


def tiny(layers: int, repeats: int) -> str:
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    proto = tiny_transformer(layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/tiny_{layers}.onnx"
        onnx.save(proto, path)
        model = onnx2jax.translate(path)
    session = _session(proto)
    calls = {
        "onnxruntime session.run": lambda: session.run(None, {"x": x}),
        "onnx2jax model(x)": lambda: jax.block_until_ready(model(x)),
        "its executable, called directly": _executable(model, x, {}),
    }
    refused = []
    for name, options in OPTIONS.items():
        try:
            calls[f"executable, {name}"] = _executable(model, x, options)
        except Exception as e:  # noqa: BLE001 - an option XLA does not take is reported, not fatal
            refused.append(f"- {name} {options}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    times = _times(calls, repeats)
    reference = {k: np.asarray(v) for k, v in zip(["y"], session.run(None, {"x": x}))}["y"]
    diff = float(np.max(np.abs(np.asarray(model(x)[0]) - reference)))
    text = _table(f"Tiny transformer, {layers} layers, [2, 16, 64] (max abs diff vs onnxruntime {diff:.1e})",
                  times, "onnxruntime session.run")
    return text + ("\n\nOptions XLA refused:\n" + "\n".join(refused) if refused else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--layers", default="2,8,32")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "per_call.md"))
    args = parser.parse_args()
    parts = [floor(args.repeats)]
    for layers in (int(n) for n in args.layers.split(",")):
        parts.append(tiny(layers, args.repeats))
        print(parts[-1], flush=True)
    note = (f"jax {jax.__version__}, onnxruntime {ort.__version__} (intra-op spinning off), onnx2jax "
            f"{onnx2jax.__version__}; {os.cpu_count()} CPU(s); {args.repeats} rounds after 20 warm-up rounds.")
    text = "\n\n".join([*parts, note]) + "\n"
    print(parts[0])
    pathlib.Path(args.output).parent.mkdir(exist_ok=True)
    pathlib.Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
