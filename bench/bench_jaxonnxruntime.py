"""jaxonnxruntime (the other ONNX -> JAX runtime on PyPI) against onnx2jax on the same models.

Each runtime runs in its own process (they need different environments), the
two alternating model by model, measured the same way: the first call (load,
convert, trace, compile, run; imports excluded) and then the median and
interquartile range of ``--repeats`` jitted calls after 5 warm-up calls. Every
output is checked against onnxruntime's; a model a runtime cannot run is
listed with the exception it raised.

jaxonnxruntime is called as its example does: ``call_onnx.call_onnx_model(model,
inputs)`` gives ``(model_func, params)``, then ``jax.jit(model_func)(params,
inputs)`` (x64 on, as its tests set it). It may pin other versions, so it
lives in its own virtual environment, never the project's:

    python3 -m venv /work/jorvenv
    /work/jorvenv/bin/pip install jaxonnxruntime onnx onnxruntime
    python bench/bench_jaxonnxruntime.py --jor-python /work/jorvenv/bin/python [--repeats 100] [--layers 2,8,32]

Models: the transformer fixtures (``tests/data/tiny_{llama,gpt2,bert}.onnx``),
tiny transformer exports of ``--layers`` depths (``bench/tiny_transformer.py``)
and ``--zoo`` models of ``tests/data/zoo``. Writes ``bench/results/jaxonnxruntime.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
ZOO = ("resnet", "convnext", "gpt2", "roberta", "qwen2", "mistral")


def _worker(runtime: str, path: str, inputs_path: str, reference_path: str, repeats: int) -> dict:
    """Runs one model in this process; returns what was measured (or the error) as a dict."""
    import statistics
    import time

    import numpy as np
    import onnx

    inputs = dict(np.load(inputs_path))
    reference = list(np.load(reference_path).values())
    import jax

    start = time.perf_counter()
    try:
        if runtime == "jaxonnxruntime":
            jax.config.update("jax_enable_x64", True)
            from jaxonnxruntime import call_onnx

            model = onnx.load(path)
            names = [i.name for i in model.graph.input if i.name in inputs]
            values = [inputs[n] for n in names]
            model_func, params = call_onnx.call_onnx_model(model, values)
            jitted = jax.jit(model_func)

            def call():
                return jax.block_until_ready(jitted(params, values))
        else:
            import onnx2jax

            model = onnx2jax.translate(path)

            def call():
                return jax.block_until_ready(model(**inputs))

        outputs = call()
    except Exception as e:  # noqa: BLE001 - a model a runtime cannot run is a result, reported with its error
        return {"ok": False, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}",
                "seconds": time.perf_counter() - start}
    first = time.perf_counter() - start
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    diff = max(float(np.max(np.abs(np.asarray(o, np.float64) - np.asarray(r, np.float64)))) if np.size(r) else 0.0
               for o, r in zip(outputs, reference))
    for _ in range(5):
        call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    q1, q3 = np.percentile(times, [25, 75])
    return {"ok": True, "first_call_s": first, "median_ms": statistics.median(times) * 1e3,
            "iqr_ms": float(q3 - q1) * 1e3, "max_abs_diff": diff, "jax": jax.__version__}


def _models(layers: list[int], zoo: list[str], tmp: str) -> list[tuple[str, str, str, str]]:
    """(name, model path, inputs npz, onnxruntime outputs npz) of every model to run."""
    import numpy as np
    import onnx
    import onnxruntime as ort

    sys.path.insert(0, str(ROOT / "bench"))
    from tiny_transformer import tiny_transformer

    models = [(n, str(DATA / f"{n}.onnx"), str(DATA / f"{n}.inputs.npz"), str(DATA / f"{n}.ort_outputs.npz"))
              for n in ("tiny_llama", "tiny_gpt2", "tiny_bert")]
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    for n in layers:
        path = f"{tmp}/tiny_{n}.onnx"
        onnx.save(tiny_transformer(n), path)
        np.savez(f"{tmp}/tiny_{n}.inputs.npz", x=x)
        (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.savez(f"{tmp}/tiny_{n}.ort_outputs.npz", y=y)
        models.append((f"tiny transformer, {n} layers", path, f"{tmp}/tiny_{n}.inputs.npz", f"{tmp}/tiny_{n}.ort_outputs.npz"))
    for n in zoo:
        base = DATA / "zoo" / n
        models.append((f"zoo/{n}", f"{base}.onnx", f"{base}.inputs.npz", f"{base}.ort_outputs.npz"))
    return models


STATIC_ARGS = "JAXORT_ONLY_ALLOW_INITIALIZERS_AS_STATIC_ARGS"
"""jaxonnxruntime's switch (default on) that refuses a static argument computed from the inputs (a Range
over a shape, say); a model refused for that is run again with it off."""


def _run(python: str, runtime: str, model: tuple[str, str, str, str], repeats: int, env: dict | None = None) -> dict:
    _, path, inputs, reference = model
    done = subprocess.run([python, __file__, "--worker", runtime, path, inputs, reference, str(repeats)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800, env={**os.environ, **(env or {})})
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"ok": False, "error": f"process failed (exit {done.returncode}): {tail[:300]}"}
    return json.loads(lines[-1])


def _cell(result: dict) -> tuple[str, str, str]:
    if not result["ok"]:
        return "fails", "-", "-"
    return (f"{result['median_ms']:.3f} ({result['iqr_ms']:.3f})", f"{result['first_call_s']:.2f}",
            f"{result['max_abs_diff']:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jor-python", default="/work/jorvenv/bin/python", help="python of jaxonnxruntime's venv")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--layers", default="2,8,32")
    parser.add_argument("--zoo", default=",".join(ZOO))
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "jaxonnxruntime.md"))
    parser.add_argument("--worker", nargs=5, metavar=("RUNTIME", "MODEL", "INPUTS", "REFERENCE", "REPEATS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runtime, path, inputs, reference, repeats = args.worker
        print(json.dumps(_worker(runtime, path, inputs, reference, int(repeats))))
        return
    rows, errors = [], []
    with tempfile.TemporaryDirectory() as tmp:
        layers = [int(n) for n in args.layers.split(",") if n]
        for model in _models(layers, [z for z in args.zoo.split(",") if z], tmp):
            theirs = _run(args.jor_python, "jaxonnxruntime", model, args.repeats)
            if not theirs["ok"] and "static argument" in theirs["error"]:
                errors.append(f"- {model[0]}, jaxonnxruntime: `{theirs['error']}`; with {STATIC_ARGS}=0:")
                theirs = _run(args.jor_python, "jaxonnxruntime", model, args.repeats, {STATIC_ARGS: "0"})
                if theirs["ok"]:
                    errors[-1] += " runs"
            ours = _run(sys.executable, "onnx2jax", model, args.repeats)
            load = os.getloadavg()[0]
            ratio = f"{ours['median_ms'] / theirs['median_ms']:.2f}" if ours["ok"] and theirs["ok"] else "-"
            row = f"| {model[0]} | {' | '.join(_cell(ours))} | {' | '.join(_cell(theirs))} | {ratio} | {load:.1f} |"
            rows.append(row)
            print(row, flush=True)
            if not ours["ok"]:
                errors.append(f"- {model[0]}, onnx2jax: `{ours['error']}`")
            if not theirs["ok"]:
                retried = errors and errors[-1].startswith(f"- {model[0]}, jaxonnxruntime:")
                if retried:
                    errors[-1] += f" `{theirs['error']}`"
                else:
                    errors.append(f"- {model[0]}, jaxonnxruntime: `{theirs['error']}`")
    header = ("| model | onnx2jax ms (IQR) | onnx2jax first call s | onnx2jax max abs diff "
              "| jaxonnxruntime ms (IQR) | jaxonnxruntime first call s | jaxonnxruntime max abs diff "
              "| ratio onnx2jax / jaxonnxruntime | load average |\n" + "|---" * 9 + "|")
    text = "\n".join([header, *rows]) + "\n"
    if errors:
        text += "\nWhat failed, with the exception raised:\n\n" + "\n".join(errors) + "\n"
    text += (f"\nMedian (interquartile range) of {args.repeats} jitted calls after 5 warm-up calls, each runtime in "
             "its own process; first call = load + convert + trace + compile + run, imports excluded; max abs "
             "diff against onnxruntime's outputs.\n")
    print(text)
    pathlib.Path(args.output).parent.mkdir(exist_ok=True)
    pathlib.Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
