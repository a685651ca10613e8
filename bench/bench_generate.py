"""Decode tokens/s and time to first token: onnx2jax against onnxruntime-genai on one CPU device (issue 20).

Greedy generation of one prompt to ``--max-length`` with the builder's folders: the tiny fixtures
``tests/data/genai/llama_gqa`` and its int4 build ``llama_gqa_int4``, and the medium model (6 layers,
width 512, 8 query / 2 KV heads, fp32 and int4) that
``/work/venvs/fixtures/bin/python scripts/make_genai_fixtures.py --medium bench/models/genai_medium`` builds.

onnxruntime-genai runs in its own virtualenv (``--genai-python``, default ``/work/venvs/fixtures/bin/python``;
it has no jax), as a subprocess of ``bench/genai_timings.py`` printing its timings as JSON; onnx2jax runs here,
with one handle (:func:`onnx2jax.load`, a :class:`~onnx2jax.runtime.decoder.Decoder`) per model (compiled once, warmed up). The two alternate in
``--rounds`` rounds of ``--repeats`` generations each, so that the shared machine's load hits both; medians
over all rounds, the ratio onnx2jax / onnxruntime-genai of each, and the tokens of both compared.

- time to first token: a new generator, the prompt's prefill, the first token on the host;
- decode tokens/s: the tokens after the first over the time from the first to the last (wall), and the
  same over process CPU time (all threads), which the other processes' load inflates less.

``--tp 1,2,4,8`` adds, for the tiny fixture on that many fake CPU devices (a subprocess with
``--xla_force_host_platform_device_count=8``): the collectives of one decode step (counted in the compiled
decode program's HLO, whose ``while`` body is the step), the cache and parameter bytes on one device (from the
arrays' shardings: the shard on the first device) against the whole, and decode tokens/s.

The real-width models (8 layers, width 1024, FFN 2816, 16/4 heads; int4 at the builder's CPU default
``accuracy_level`` 4) come from ``scripts/make_genai_fixtures.py --real bench/models/genai_real`` (issue 30).
``--prefill`` adds the time to the first token of a 128-token prompt on both runtimes; the int4 / fp32 table
our int4 decode against our own fp32 decode of the same model; ``--memory 'real int4,real fp32'`` the peak RSS
above a jax baseline of loading and generating (a fresh process each).

    python bench/bench_generate.py [--max-length 128] [--rounds 3] [--repeats 10] [--tp 1,2,4,8] \
        [--prefill] [--memory 'real int4'] [--step-costs] [--output bench/results/generate.md]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time
from collections import Counter
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
GENAI = ROOT / "tests" / "data" / "genai"
MEDIUM = ROOT / "bench" / "models" / "genai_medium"
REAL = ROOT / "bench" / "models" / "genai_real"
MODELS = {
    "tiny fp32": GENAI / "llama_gqa",
    "tiny int4": GENAI / "llama_gqa_int4",
    "medium fp32": MEDIUM / "llama_medium_fp32",
    "medium int4": MEDIUM / "llama_medium_int4",
    "real fp32": REAL / "llama_real_fp32",
    "real int4": REAL / "llama_real_int4",
}
PROMPT = [1, 17, 230, 45, 9, 300, 12, 77, 401, 5, 88, 19, 250, 33, 64, 128]
"""16 token ids below every model's vocabulary (512)."""
LONG_PROMPT = [(7 * i + 11) % 500 + 4 for i in range(128)]
"""128 token ids (4..503) for the prefill measure: the time to the first token of a 128-token prompt."""

COLLECTIVES = re.compile(r"\b(all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(")


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def genai_run(python: str, folder: pathlib.Path, max_length: int, repeats: int, prompt: list[int] = PROMPT) -> dict:
    """One subprocess of bench/genai_timings.py: its JSON."""
    command = [python, str(ROOT / "bench" / "genai_timings.py"), str(folder), "--prompt",
               ",".join(map(str, prompt)), "--max-length", str(max_length), "--repeats", str(repeats)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def onnx2jax_run(decoder, max_length: int, repeats: int, prompt: list[int] = PROMPT, per_call: int = 1) -> dict:
    """``repeats`` greedy generations through :class:`Generator`'s iteration: the same measures as
    genai_timings.py. ``per_call`` 1: one decode step per call, each token on the host before the next step (as
    the CLI streams and as onnxruntime-genai's generate_next_token loop runs); more: that many steps per call of
    the decode program (at most DECODE_STEPS), as :func:`onnx2jax.generate` runs where nobody listens."""
    from onnx2jax.runtime.generate import Generator

    ttft, decode, cpu, steps = [], [], [], []
    sequence = None
    for _ in range(repeats):
        start = time.perf_counter()
        generator = Generator(decoder, prompt, max_length=max_length)
        tokens = iter(generator) if per_call == 1 else generator._steps(per_call)  # _steps: generate()'s loop
        next(tokens)
        first = time.perf_counter()
        cpu_start = time.process_time()
        count = sum(1 for _ in tokens)
        decode.append(time.perf_counter() - first)
        cpu.append(time.process_time() - cpu_start)
        ttft.append(first - start)
        steps.append(count)
        sequence = generator.sequences[0].tolist()
    return {"ttft_s": ttft, "decode_s": decode, "decode_cpu_s": cpu, "steps": steps, "tokens": sequence}


def single_device(args: argparse.Namespace) -> list[dict]:
    from onnx2jax.runtime.load import load

    rows = []
    for name, folder in MODELS.items():
        if name not in args.models:
            continue
        if not (folder / "genai_config.json").exists():
            print(f"skipping {name}: {folder} not built (scripts/make_genai_fixtures.py --medium)", file=sys.stderr)
            continue
        decoder = load(folder)
        onnx2jax_run(decoder, args.max_length, 2)  # compiles the prefill and decode programs
        long_length = len(LONG_PROMPT) + 2
        if args.prefill:
            onnx2jax_run(decoder, long_length, 2, LONG_PROMPT)  # and the 128-token prompt's prefill
        ours: dict[str, Any] = {}
        theirs: dict[str, Any] = {"version": "?"}
        for _ in range(args.rounds):
            for side, run, long_run in (
                (theirs, lambda: genai_run(args.genai_python, folder, args.max_length, args.repeats),
                 lambda: genai_run(args.genai_python, folder, long_length, args.repeats, LONG_PROMPT)),
                (ours, lambda: onnx2jax_run(decoder, args.max_length, args.repeats, per_call=args.steps_per_call),
                 lambda: onnx2jax_run(decoder, long_length, args.repeats, LONG_PROMPT)),
            ):
                result = run()
                for key in ("ttft_s", "decode_s", "decode_cpu_s", "steps"):
                    side.setdefault(key, []).extend(result[key])
                side["tokens"] = result["tokens"]
                if "version" in result:
                    side["version"] = result["version"]
                if args.prefill:
                    side.setdefault("prefill_s", []).extend(long_run()["ttft_s"])
        row = {"model": name, "same_tokens": ours["tokens"] == theirs["tokens"], "new_tokens": ours["steps"][0] + 1,
               "genai_version": theirs["version"],
               "first_difference": next((i for i, (a, b) in enumerate(zip(ours["tokens"], theirs["tokens"]))
                                         if a != b), None)}
        for label, side in (("onnx2jax", ours), ("genai", theirs)):
            row[f"{label}_ttft_ms"] = median(side["ttft_s"]) * 1e3
            row[f"{label}_tok_s"] = median([n / t for n, t in zip(side["steps"], side["decode_s"])])
            row[f"{label}_cpu_tok_s"] = median([n / max(t, 1e-9) for n, t in zip(side["steps"], side["decode_cpu_s"])])
            if args.prefill:
                row[f"{label}_prefill128_ms"] = median(side["prefill_s"]) * 1e3
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def step_costs(folder: pathlib.Path, max_length: int, repeats: int) -> dict:
    """Where one decode step's time goes on one device (µs per step, medians of ``repeats`` calls):

    - ``one_step_call``: the decode program called for one step, its token brought to the host each step
      (what a step cost before the program ran several);
    - ``fixed_cost_call``: a jitted program taking the same arguments (parameters, cache, state, token) and
      doing nothing but donate and return them, token to the host: the call's fixed cost (binding the
      arguments, starting an executable, the transfer);
    - ``in_loop``: a step of a 16-step call (the program's ``while`` body: the model and the on-device
      choice and eos check), that call's transfer shared by its 16 steps;
    - ``host_per_token``: the Generator's host bookkeeping of one token (eos and max_length checked for a
      16-step call's tokens at once, then each token into the sequences).
    """
    import jax
    import numpy as np

    from onnx2jax.runtime.decoder import DECODE_STEPS
    from onnx2jax.runtime.load import load
    from onnx2jax.runtime.generate import Generator

    decoder = load(folder)
    generator = Generator(decoder, PROMPT, max_length=max_length)
    generator.generate_next_token()
    program = decoder.decode(generator.search)
    state = [generator._cache, generator._state, generator._token]
    rewind = {"lengths": -DECODE_STEPS, "step": -DECODE_STEPS}

    def call(count: int) -> None:
        cache, st, token, tokens = program(decoder.params, state[0], state[1], state[2], np.int32(count))
        np.asarray(tokens)
        if count == DECODE_STEPS:  # back to the same positions, so that every call writes within the capacity
            st = {k: (v + rewind[k] if k in rewind else v) for k, v in st.items()}
        state[:] = [cache, st, token]

    nothing = jax.jit(lambda params, cache, st, token: (cache, st, token + 0), donate_argnums=(1, 2))

    def fixed() -> None:
        cache, st, token = nothing(decoder.params, state[0], state[1], state[2])
        np.asarray(token)
        state[:] = [cache, st, token]

    def timed(fn, per: int) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) / per)
        return median(times) * 1e6

    with decoder.x64():
        costs = {"one_step_call": timed(lambda: call(1), 1), "fixed_cost_call": timed(fixed, 1),
                 "in_loop": timed(lambda: call(DECODE_STEPS), DECODE_STEPS)}
    host = Generator(decoder, PROMPT, max_length=max_length)
    chunk = np.full((DECODE_STEPS, 1), 5, np.int32)
    start = time.perf_counter()
    for _ in range(100):
        host._new.clear()
        host._taken = 0
        host._take(chunk)
        for _ in range(DECODE_STEPS):
            host._next()
    costs["host_per_token"] = (time.perf_counter() - start) / (100 * DECODE_STEPS) * 1e6
    return costs


def _vm(field: str) -> int:
    """A /proc/self/status field in bytes (VmHWM: the peak resident set since the last reset, VmRSS: now)."""
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def memory(folder: pathlib.Path, max_length: int) -> dict:
    """Peak RSS of loading ``folder`` and generating to ``max_length`` from PROMPT, above a jax baseline (run in a
    fresh process): the baseline is taken after the imports, the device made and one tiny jit; the peak
    (VmHWM) is reset through /proc/self/clear_refs first. Also the placed parameters' bytes."""
    import jax
    import jax.numpy as jnp

    import onnx2jax
    from onnx2jax.runtime.decoder import Decoder

    jax.jit(lambda x: x + 1)(jnp.ones(4)).block_until_ready()
    pathlib.Path("/proc/self/clear_refs").write_text("5")
    baseline = _vm("VmHWM")
    decoder = Decoder(folder)
    onnx2jax.generate(decoder, [PROMPT], max_length=max_length)
    params = sum(p.nbytes for p in jax.tree_util.tree_leaves(decoder.params))
    return {"baseline": baseline, "peak_above": _vm("VmHWM") - baseline, "param_bytes": params}


def memory_rows(names: list[str], max_length: int) -> list[dict]:
    rows = []
    for name in names:
        if not (MODELS[name] / "genai_config.json").exists():
            continue
        out = subprocess.run([sys.executable, __file__, "--memory-only", name, "--max-length", str(max_length)],
                             check=True, capture_output=True, text=True, env=dict(os.environ, JAX_PLATFORMS="cpu")).stdout
        rows.append({"model": name, **json.loads(out.strip().splitlines()[-1])})
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def tensor_parallel(devices: list[int], max_length: int, repeats: int) -> list[dict]:
    """The tiny fixture on 1/2/4/8 fake CPU devices (run in a process with 8 of them)."""
    import jax
    import numpy as np

    from onnx2jax.runtime.load import load
    from onnx2jax.runtime.generate import Generator

    rows = []
    for n in devices:
        decoder = load(GENAI / "llama_gqa", devices=n if n > 1 else None)
        generator = Generator(decoder, PROMPT, max_length=max_length)
        generator.generate_next_token()
        with decoder.x64():
            text = decoder.decode(generator.search).lower(
                decoder.params, generator._cache, generator._state, generator._token, np.int32(1)
            ).compile().as_text()
        collectives = Counter(COLLECTIVES.findall(text))
        first = jax.devices()[0]

        def on_first(array) -> int:
            return sum(s.data.nbytes for s in array.addressable_shards if s.device == first)

        cache_whole = sum(c.nbytes for c in generator._cache)
        cache_first = sum(on_first(c) for c in generator._cache)
        params = jax.tree_util.tree_leaves(decoder.params)
        params_whole = sum(p.nbytes for p in params)
        params_first = sum(on_first(p) for p in params)
        for _ in generator:
            pass
        runs = onnx2jax_run(decoder, max_length, repeats)
        rows.append({
            "devices": n,
            "collectives": dict(sorted(collectives.items())),
            "cache_bytes_first_device": cache_first, "cache_bytes_whole": cache_whole,
            "param_bytes_first_device": params_first, "param_bytes_whole": params_whole,
            "tok_s": median([s / t for s, t in zip(runs["steps"], runs["decode_s"])]),
            "note": decoder.placement.note if decoder.placement is not None else "",
        })
    return rows


def markdown(rows: list[dict], tp: list[dict], load: tuple, args: argparse.Namespace,
             memory: list[dict] | None = None) -> str:
    import jax

    lines = [
        "| model | new tokens | same tokens | onnx2jax TTFT ms | genai TTFT ms | onnx2jax tok/s | genai tok/s | "
        "ratio tok/s | onnx2jax tok/CPU s | genai tok/CPU s | ratio CPU |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['new_tokens']} | {'yes' if r['same_tokens'] else 'NO'} | "
            f"{r['onnx2jax_ttft_ms']:.2f} | {r['genai_ttft_ms']:.2f} | "
            f"{r['onnx2jax_tok_s']:,.0f} | {r['genai_tok_s']:,.0f} | "
            f"{r['onnx2jax_tok_s'] / r['genai_tok_s']:.2f} | {r['onnx2jax_cpu_tok_s']:,.0f} | "
            f"{r['genai_cpu_tok_s']:,.0f} | {r['onnx2jax_cpu_tok_s'] / r['genai_cpu_tok_s']:.2f} |"
        )
    if args.prefill:
        lines += ["", "| model | onnx2jax ms to the first token of a 128-token prompt | genai ms | ratio time "
                  "(below 1: onnx2jax faster) |", "|---|---|---|---|"]
        for r in rows:
            lines.append(f"| {r['model']} | {r['onnx2jax_prefill128_ms']:.1f} | {r['genai_prefill128_ms']:.1f} | "
                         f"{r['onnx2jax_prefill128_ms'] / r['genai_prefill128_ms']:.2f} |")
    by_name = {r["model"]: r for r in rows}
    pairs = [(size, by_name[f"{size} int4"], by_name[f"{size} fp32"]) for size in ("tiny", "medium", "real")
             if f"{size} int4" in by_name and f"{size} fp32" in by_name]
    if pairs:
        lines += ["", "| model | onnx2jax int4 tok/s | onnx2jax fp32 tok/s | int4 / fp32 (ours) | "
                  "genai int4 / genai fp32 |", "|---|---|---|---|---|"]
        for size, q, f in pairs:
            lines.append(f"| {size} | {q['onnx2jax_tok_s']:,.0f} | {f['onnx2jax_tok_s']:,.0f} | "
                         f"{q['onnx2jax_tok_s'] / f['onnx2jax_tok_s']:.2f} | {q['genai_tok_s'] / f['genai_tok_s']:.2f} |")
    if memory:
        lines += ["", "| model | parameter bytes placed | peak RSS above the jax baseline | peak / parameters |",
                  "|---|---|---|---|"]
        for m in memory:
            lines.append(f"| {m['model']} | {m['param_bytes'] / 2**20:,.1f} MiB | {m['peak_above'] / 2**20:,.1f} MiB | "
                         f"{m['peak_above'] / m['param_bytes']:.2f} |")
    costs = [r for r in rows if "steps_us" in r]
    if costs:
        lines += ["", "| model | one step per call µs | of which the call's fixed cost µs | "
                  "a step of a 16-step call µs | host bookkeeping per token µs | onnxruntime-genai µs per step |",
                  "|---|---|---|---|---|---|"]
        for r in costs:
            c = r["steps_us"]
            lines.append(f"| {r['model']} | {c['one_step_call']:.1f} | {c['fixed_cost_call']:.1f} | "
                         f"{c['in_loop']:.1f} | {c['host_per_token']:.1f} | {1e6 / r['genai_tok_s']:.1f} |")
    version = rows[0]["genai_version"] if rows else "?"
    lines.append("")
    lines.append(
        f"Greedy, one prompt of {len(PROMPT)} tokens, max_length {args.max_length}; medians of {args.rounds} rounds "
        f"x {args.repeats} generations of each runtime in turn; onnx2jax's XLA CPU dispatch {args.dispatch} "
        f"(`--dispatch`), {args.steps_per_call} decode step(s) a call (`--steps-per-call`); ratio: onnx2jax / onnxruntime-genai (above 1: "
        f"onnx2jax faster). Load average (1, 5, 15 min) before {load[0][0]:.2f} {load[0][1]:.2f} {load[0][2]:.2f}, "
        f"after {load[1][0]:.2f} {load[1][1]:.2f} {load[1][2]:.2f}; {os.cpu_count()} CPU(s); jax {jax.__version__}, "
        f"onnxruntime-genai {version}."
    )
    if tp:
        lines += ["", "| devices | collectives per decode step | cache bytes, one device / whole | "
                  "parameter bytes, one device / whole | decode tok/s | note |", "|---|---|---|---|---|---|"]
        for r in tp:
            coll = ", ".join(f"{k} {v}" for k, v in r["collectives"].items()) or "none"
            lines.append(
                f"| {r['devices']} | {coll} | {r['cache_bytes_first_device']:,} / {r['cache_bytes_whole']:,} "
                f"({r['cache_bytes_first_device'] / r['cache_bytes_whole']:.3f}) | "
                f"{r['param_bytes_first_device']:,} / {r['param_bytes_whole']:,} "
                f"({r['param_bytes_first_device'] / r['param_bytes_whole']:.3f}) | {r['tok_s']:,.0f} | {r['note']} |"
            )
        lines.append("")
        lines.append(f"tests/data/genai/llama_gqa on fake CPU devices (one host, {os.cpu_count()} cores: the tok/s "
                     "shows the collectives' cost on one host, not a speed-up).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tp", default="", help="devices for the tensor-parallel table, e.g. 1,2,4,8")
    parser.add_argument("--tp-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory-only", help=argparse.SUPPRESS)
    parser.add_argument("--prefill", action="store_true",
                        help="also time the first token of a 128-token prompt (prefill) on both runtimes")
    parser.add_argument("--memory", default="",
                        help="comma-separated models whose peak RSS above a jax baseline is measured, each in a "
                        "fresh process (e.g. 'real int4,real fp32')")
    parser.add_argument("--step-costs", action="store_true", help="also the fp32 models' per-step cost breakdown")
    parser.add_argument("--genai-python", default="/work/venvs/fixtures/bin/python")
    parser.add_argument("--output", help="also write the markdown here")
    parser.add_argument("--steps-per-call", type=int, default=1,
                        help="onnx2jax's decode steps per call of its decode program: 1 streams (a token to the "
                        "host per step, as onnxruntime-genai's loop); 16 is what onnx2jax.generate runs where "
                        "nobody listens")
    parser.add_argument("--dispatch", choices=("sync", "async"), default="sync",
                        help="XLA CPU executions on the calling thread (sync: what `onnx2jax generate` runs with, "
                        "since each step's token is read before the next) or on JAX's worker threads (async: "
                        "JAX's default, what a library caller gets unless it sets jax_cpu_enable_async_dispatch)")
    args = parser.parse_args()
    if args.dispatch == "sync":
        import jax

        jax.config.update("jax_cpu_enable_async_dispatch", False)  # before the backend starts
    args.models = args.models.split(",")
    devices = [int(d) for d in args.tp.split(",") if d]
    if args.tp_only:
        print(json.dumps(tensor_parallel(devices, args.max_length, args.repeats)))
        return
    if args.memory_only:
        print(json.dumps(memory(MODELS[args.memory_only], args.max_length)))
        return
    load_before = os.getloadavg()
    rows = single_device(args)
    for row in rows:
        if "fp32" in row["model"] and args.step_costs:
            row["steps_us"] = step_costs(MODELS[row["model"]], args.max_length, 50 if "tiny" in row["model"] else 10)
            print(json.dumps(row["steps_us"]), file=sys.stderr, flush=True)
    tp = []
    if devices:
        flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
        env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu")
        out = subprocess.run([sys.executable, __file__, "--tp-only", "--tp", args.tp, "--max-length",
                              str(args.max_length), "--repeats", str(args.repeats)],
                             check=True, capture_output=True, text=True, env=env).stdout
        tp = json.loads(out.strip().splitlines()[-1])
    mem = memory_rows([m for m in args.memory.split(",") if m], args.max_length)
    text = markdown(rows, tp, (load_before, os.getloadavg()), args, mem)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text)


if __name__ == "__main__":
    main()
