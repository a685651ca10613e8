"""Real-size models (issue 21): first result, peak memory over the weights, per-call time.

Makes the models on demand (never committed; random weights, external data
written tensor by tensor so that making them holds one tensor at a time):

- ``gpt2``: GPT-2 small's shape (12 layers, width 768, 12 heads, vocabulary
  50,257, 1,024 positions, tied head), 124M parameters, ~500 MB;
- ``llama``: a ~336M Llama with grouped-query attention (24 layers, width
  1,024, 16 heads, 4 key/value heads, MLP 2,816, vocabulary 32,000), ~1.34 GB;
- ``synthetic``: two [16400, 16400] MatMuls, 2.15 GB of external data made
  sparse with ``truncate`` (all zeros, cheap to make, nothing read to annotate
  or check it).

Each measurement runs in a fresh process. Its baseline is taken after the
imports (python, jax, onnx2jax or onnxruntime), the devices made and one tiny
jit; peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) minus that
baseline is reported over W, the model's weight bytes. "first" is the wall
time from the process's start to its first result, imports included (no
persistent compilation cache unless ``--compilation-cache``; this checkout's bytecode compiled beforehand, as
an installed package's is: ``_bytecode_env``).

    python bench/real_size.py --models gpt2 --folder /tmp/models --runs ort,jax1,annotate
    python bench/real_size.py --make synthetic --folder /tmp/models
    python bench/real_size.py --models gpt2_cache,llama_cache --runs gen-ort,gen1,gen8

Generation (``gen-ort``, ``gen1``, ``gen8``, issue 28) runs on torch exports with their caches, made by
``scripts/make_torch_cache_exports.py --real-size bench/models/real_size``: a greedy run of 32 tokens after a
128-token prompt; "first" is the first new token's time from the process's start (onnxruntime: its session
and the prefill; onnx2jax: ``onnx2jax.load`` and the prefill), "first_cpu" the process's CPU seconds (all its
threads) until then, decode tokens/s over the decode time alone.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's onnx2jax, not an installed one
import medium_transformers as mt  # noqa: E402

GPT2 = mt.Config(layers=12, width=768, heads=12, kv_heads=12, ffn=3072, vocab=50257, positions=1024)
LLAMA = mt.Config(layers=24, width=1024, heads=16, kv_heads=4, llama_ffn=2816, vocab=32000)
SYNTHETIC_WIDTH = 16400
SHAPE = (1, 128)  # batch x sequence of a call
MMAP_THRESHOLD = 0
"""glibc's ``MALLOC_MMAP_THRESHOLD_`` for the measured processes (0: glibc's default, a threshold that
rises to 32 MB once a large buffer is freed, after which freed output buffers stay in the heap: with 8 fake
devices each call's replicated outputs then add to the peak; ``--mmap-threshold 1048576`` fixes it)."""
RUNS = ("ort", "jax1", "tp8", "pp2x4", "annotate", "check")
GENERATION_RUNS = ("gen-ort", "gen1", "gen8")
"""Generation (issue 28) on a torch export with its cache (``--models gpt2_cache,llama_cache``, made by
``scripts/make_torch_cache_exports.py --real-size``): onnxruntime's session and prefill then a greedy loop
feeding the presents back, against ``onnx2jax.load`` + ``Generator`` on 1 and 8 devices."""
PROMPT, NEW_TOKENS = 128, 32


class _StreamGraph(mt._Graph):
    """medium_transformers' graph builder, each parameter written to the external data file as it is made."""

    def __init__(self, seed: int, data: pathlib.Path) -> None:
        super().__init__(seed)
        self.file = open(data, "wb")
        self.location = data.name

    def param(self, name: str, array: np.ndarray) -> str:
        array = np.ascontiguousarray(array, np.float32)
        offset = self.file.tell()
        offset += -offset % 64
        self.file.seek(offset)
        self.file.write(array.tobytes())
        self.inits.append(_external(name, array.shape, self.location, offset))
        return name


def _external(name: str, shape: tuple[int, ...], location: str, offset: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=list(shape))
    tensor.data_location = TensorProto.EXTERNAL
    length = int(np.prod(shape)) * 4
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def make(kind: str, folder: pathlib.Path) -> pathlib.Path:
    """The ``kind`` model's path in ``folder``, made first when missing."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{kind}.onnx"
    if path.exists():
        return path
    data = folder / f"{kind}.data"
    if kind == "synthetic":
        n = SYNTHETIC_WIDTH
        size = n * n * 4
        with open(data, "wb") as f:
            f.truncate(2 * size)  # sparse: zeros that take no disk and are never read to annotate
        inits = [_external("w1", (n, n), data.name, 0), _external("w2", (n, n), data.name, size)]
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
                 helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")]
        graph = helper.make_graph(
            nodes, "synthetic",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", n])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", n])], inits,
        )
    else:
        config = GPT2 if kind == "gpt2" else LLAMA
        g = _StreamGraph(0, data)
        inputs, outputs = mt._BUILDERS["gpt2" if kind == "gpt2" else "llama_gqa"](g, config)
        g.file.close()
        graph = helper.make_graph(
            g.nodes, kind,
            [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in outputs], g.inits,
        )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="bench/real_size.py")
    model.ir_version = 10
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)
    return path


def weight_bytes(path: pathlib.Path) -> int:
    """W: the bytes of the model's float initializers (external data not read)."""
    proto = onnx.load(str(path), load_external_data=False)
    return sum(int(np.prod(t.dims)) * 4 for t in proto.graph.initializer if t.data_type == TensorProto.FLOAT)


def _inputs(kind: str) -> dict[str, np.ndarray]:
    if kind == "synthetic":
        return {"x": np.ones((SHAPE[0], SYNTHETIC_WIDTH), np.float32)}
    config = GPT2 if kind == "gpt2" else LLAMA
    return mt.inputs("gpt2" if kind == "gpt2" else "llama_gqa", *SHAPE, config)


# -- the measured child ------------------------------------------------------


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _child(run: str, path: str, kind: str, folder: str) -> dict:
    """One measurement, in this (fresh) process; prints and returns its JSON line."""
    result: dict = {"run": run}
    if run in ("ort", "gen-ort"):
        import onnxruntime as ort  # noqa: F401 - imported before the baseline, as jax is for the others
    else:
        import jax
        import jax.numpy as jnp

        import onnx2jax  # noqa: F401

        jax.jit(lambda x: x + 1)(jnp.ones(4)).block_until_ready()
        result["devices"] = len(jax.devices())
    baseline = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS
    if run in GENERATION_RUNS:
        result.update(_generation(run, path))
        result["peak_over_baseline"] = _status("VmHWM") - baseline
        result["baseline"] = baseline
        print("RESULT " + json.dumps(result), flush=True)
        return result
    feeds = _inputs(kind)
    start = time.perf_counter()
    if run in ("annotate", "check"):
        from onnx2jax.cli.app import main

        out = os.path.join(folder, f"{kind}.tp8.onnx")
        argv = ["annotate", path, "--plan", "megatron", "--devices", "8", "-o", out] if run == "annotate" else ["check", out]
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        result["exit"] = code
        result["seconds"] = time.perf_counter() - start
    else:
        if run == "ort":
            session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
            call = lambda: session.run(None, feeds)  # noqa: E731
        else:
            import onnx2jax

            if os.environ.get("REAL_SIZE_CACHE"):
                from onnx2jax.runtime import compilation_cache

                compilation_cache.enable(os.environ["REAL_SIZE_CACHE"])
                result["compilation_cache"] = os.environ["REAL_SIZE_CACHE"]
            target = path
            if run == "tp8":
                target = os.path.join(folder, f"{kind}.tp8.onnx")
            elif run == "pp2x4":
                target = os.path.join(folder, f"{kind}.pp2x4.onnx")
            scan = {"true": True, "false": False}.get(os.environ.get("REAL_SIZE_SCAN", "auto"), "auto")
            compiled = onnx2jax.compile(target, scan_layers=scan)
            result["scan_layers"] = scan
            call = lambda: [np.asarray(o) for o in compiled(**feeds)]  # noqa: E731
        outputs = call()
        result["first_s"] = time.time() - float(os.environ["REAL_SIZE_SPAWNED"])
        result["first_in_process_s"] = time.perf_counter() - start
        result["checksum"] = float(np.asarray(outputs[0]).sum(dtype=np.float64))  # no float64 copy
        result["first_output"] = np.asarray(outputs[0]).ravel()[:64].tolist()
        del outputs  # one result held at a time, as a caller that reads it and moves on
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        result["call_s"] = sorted(times)[1]
    result["peak_over_baseline"] = _status("VmHWM") - baseline
    result["baseline"] = baseline
    print("RESULT " + json.dumps(result), flush=True)
    return result


def _prompt() -> list[int]:
    return np.random.default_rng(28).integers(4, 30000, PROMPT).tolist()


def _generation(run: str, path: str) -> dict:
    """Greedy generation of NEW_TOKENS after a PROMPT-token prompt: the first token's time from the process's
    start (session creation or loading, and the prefill), the CPU seconds the process spent until then (every thread's, imports included: the figure a
    loaded machine distorts least), then the decode rate over the decode time alone."""
    prompt = _prompt()
    out: dict = {}
    if run == "gen-ort":
        import onnxruntime as ort

        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        out["load_s"] = time.time() - float(os.environ["REAL_SIZE_SPAWNED"])
        past = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
                for i in session.get_inputs() if i.name.startswith("past_key_values")}
        names = [o.name for o in session.get_outputs()]
        ids, tokens, step = list(prompt), [], np.array([prompt], np.int64)
        for n in range(NEW_TOKENS):
            start = len(ids) - step.shape[1]
            feeds = {"input_ids": step, "attention_mask": np.ones((1, len(ids)), np.int64),
                     "position_ids": np.arange(start, len(ids))[None], **past}
            outputs = dict(zip(names, session.run(None, feeds)))
            token = int(outputs["logits"][0, -1].argmax())
            if n == 0:
                out["first_s"] = time.time() - float(os.environ["REAL_SIZE_SPAWNED"])
                out["first_cpu_s"] = time.process_time()
                first = time.perf_counter()
            tokens.append(token)
            ids.append(token)
            past = {name: outputs[name.replace("past_key_values", "present")] for name in past}
            step = np.array([[token]], np.int64)
            del outputs
    else:
        import onnx2jax

        if os.environ.get("REAL_SIZE_CACHE"):
            from onnx2jax.runtime import compilation_cache

            compilation_cache.enable(os.environ["REAL_SIZE_CACHE"])
        model = onnx2jax.load(path, devices=8 if run == "gen8" else None)
        out["load_s"] = time.time() - float(os.environ["REAL_SIZE_SPAWNED"])
        out["note"] = model.placement.note
        generator = onnx2jax.Generator(model, prompt, max_new_tokens=NEW_TOKENS)
        tokens = []
        for n, token in enumerate(generator):
            if n == 0:
                out["first_s"] = time.time() - float(os.environ["REAL_SIZE_SPAWNED"])
                out["first_cpu_s"] = time.process_time()
                first = time.perf_counter()
            tokens.append(int(token[0]))
        out["decode_tokens_per_s"] = (len(tokens) - 1) / (time.perf_counter() - first)  # its compile included
        # loaded once: the same prompt again, the programs compiled (the decode rate without its compile)
        again = iter(onnx2jax.Generator(model, prompt, max_new_tokens=NEW_TOKENS))
        next(again)
        start = time.perf_counter()
        out["decode_loaded_tokens_per_s"] = sum(1 for _ in again) / (time.perf_counter() - start)
        out["tokens"] = tokens
        return out
    out["decode_tokens_per_s"] = (len(tokens) - 1) / (time.perf_counter() - first)
    out["tokens"] = tokens
    return out


def _bytecode_env(folder: pathlib.Path) -> dict[str, str]:
    """The environment of a measured process: this checkout's bytecode compiled once, into ``folder``.

    An installed package has its ``.pyc`` files (pip compiles them); a checkout
    run with ``PYTHONDONTWRITEBYTECODE`` (as on this machine) compiles its ~140
    modules from source in every fresh process, 0.4 s or more of the first result
    that no user pays. onnxruntime and jax are installed, with their bytecode.
    """
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "onnx2jax"), str(ROOT / "sharding"),
                    str(ROOT / "bench")], env=env, check=True, capture_output=True)
    return env


def _spawn(run: str, path: pathlib.Path, kind: str, folder: pathlib.Path, timeout: int) -> dict:
    env = dict(_bytecode_env(folder), REAL_SIZE_SPAWNED=repr(time.time()))
    if MMAP_THRESHOLD:
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if run in ("tp8", "pp2x4", "gen8"):
        env["XLA_FLAGS"] = env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    command = [sys.executable, __file__, "--child", run, str(path), kind, str(folder)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"run": run, "error": f"timed out after {timeout} s"}
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return {"run": run, "error": (done.stderr or done.stdout).strip().splitlines()[-1:] or "no result"}


def _prepare(run: str, path: pathlib.Path, kind: str, folder: pathlib.Path) -> None:
    """The annotated models the sharded runs compile (written beside the source's data)."""
    import contextlib
    import io

    from onnx2jax.cli.app import main

    with contextlib.redirect_stdout(io.StringIO()):
        _annotate(main, run, path, kind, folder)


def _annotate(main, run: str, path: pathlib.Path, kind: str, folder: pathlib.Path) -> None:
    if run == "tp8" and not (folder / f"{kind}.tp8.onnx").exists():
        main(["annotate", str(path), "--plan", "megatron", "--devices", "8", "-o", str(folder / f"{kind}.tp8.onnx")])
    if run == "pp2x4" and not (folder / f"{kind}.pp2x4.onnx").exists():
        main(["annotate", str(path), "--name-nodes", "--stages", "auto:2", "--plan", "megatron", "--devices", "8",
              "-o", str(folder / f"{kind}.pp2x4.onnx")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=4, metavar=("RUN", "PATH", "KIND", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--make", metavar="KIND", help="only make the model KIND (gpt2, llama, synthetic)")
    parser.add_argument("--models", default="gpt2,llama,synthetic")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--folder", default=str(mt.MODELS / "real_size"))
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--mmap-threshold", type=int, default=0, help="MALLOC_MMAP_THRESHOLD_ of the measured processes")
    parser.add_argument("--compilation-cache", metavar="DIR",
                        help="onnx2jax's runs use JAX's persistent compilation cache in DIR (run twice: cold, then warm)")
    args = parser.parse_args()
    if args.compilation_cache:
        os.environ["REAL_SIZE_CACHE"] = args.compilation_cache
    if args.child:
        _child(*args.child)
        return
    folder = pathlib.Path(args.folder)
    global MMAP_THRESHOLD
    MMAP_THRESHOLD = args.mmap_threshold
    if args.make:
        print(make(args.make, folder))
        return
    for kind in args.models.split(","):
        path = folder / kind / "model.onnx" if kind.endswith("_cache") else make(kind, folder)
        if not path.exists():
            print(f"{kind}: {path} missing; scripts/make_torch_cache_exports.py --real-size {folder} makes it")
            continue
        w = weight_bytes(path)
        print(f"{kind}: {path} W = {w / 1e6:,.0f} MB", flush=True)
        for run in args.runs.split(","):
            if run in ("tp8", "pp2x4", "check"):
                _prepare("tp8" if run == "check" else run, path, kind, folder)
            load_before = os.getloadavg()[0]
            result = _spawn(run, path, kind, folder, args.timeout)
            result["load_average"] = [round(load_before, 1), round(os.getloadavg()[0], 1)]  # before, after
            if "peak_over_baseline" in result:
                result["peak_x_W"] = round(result["peak_over_baseline"] / w, 3)
            result.pop("first_output", None)
            result["mmap_threshold"] = MMAP_THRESHOLD
            print(f"  {kind} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main()
