"""Serving on a GPU (issue 29): onnx2jax's continuous-batching :class:`~onnx2jax.serving.Engine` in this process
(no HTTP) on the generation fixtures of ``tests/data/genai``, at concurrency 1, 4 and 16.

Per model: the engine is built (``--max-batch`` slots) and every program shape compiled (``Engine.warmup``,
timed); each fixture prompt of ``expected_tokens.json`` is run alone and compared with onnxruntime-genai's
stored greedy tokens (an independent reference); the benchmark's prompts (mixed lengths, 4 to 96 tokens,
seeded: :func:`bench_serve.prompts`) are run one at a time, untimed, as the single-request reference; then
for each concurrency c a closed loop (c requests in flight, the next submitted when one ends) of
max(4c, ``--min-requests``) greedy requests of ``--max-tokens`` tokens. Reported per level: aggregate tokens/s
(all generated tokens over the level's wall time), time to first token p50 / p99 (from submission, queueing
included), time between tokens p50, and whether every request's tokens equal its single-request run's.
Bounded: a level is skipped once ``--deadline`` seconds have passed since the start.

    PYTHONPATH=. python bench/gpu_serve.py [--models llama_gqa,llama_gqa_int4] [--out DIR]

Prints the devices and the versions first, a markdown table last (also written to ``DIR/gpu_serve.md``).
Measured once on an H200 (bench/RESULTS.md, "Serving on a GPU").
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from bench_serve import engine_level, percentile, prompts, same  # noqa: E402  (bench/ is not a package)


def versions() -> str:
    """Python and the packages that matter here, one line."""
    names = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "onnx", "numpy", "flax", "ml_dtypes")
    found = []
    for name in names:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"python {platform.python_version()}, " + ", ".join(found)


def fixture_check(engine, folder: str) -> str:
    """Each stored prompt run alone against onnxruntime-genai's greedy tokens (eos not returned by the engine):
    'k/n equal' and, for a mismatch, the first position that differs."""
    from onnx2jax.serving import SamplingParams

    stored = json.load(open(os.path.join(folder, "expected_tokens.json")))
    eos = set(engine.eos)
    equal, notes = 0, []
    for prompt, full in zip(stored["prompts"], stored["tokens"]):
        want = []
        for token in full[len(prompt):]:
            if token in eos:
                break
            want.append(token)
        rid = engine.add_request(prompt, SamplingParams(max_tokens=stored["max_length"] - len(prompt)))
        engine.run_to_completion()
        got = engine.tokens(rid)
        engine.release(rid)
        if got == want:
            equal += 1
        else:
            first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            notes.append(f"prompt of {len(prompt)} differs at generated token {first}")
    return f"{equal}/{len(stored['prompts'])} equal" + (f" ({'; '.join(notes)})" if notes else "")


def run_model(folder: str, args, start: float, rows: list, lines: list) -> None:
    from onnx2jax.serving import Engine

    config = json.load(open(os.path.join(folder, "genai_config.json")))["model"]
    name = os.path.basename(os.path.normpath(folder))
    levels = [int(c) for c in args.levels.split(",")]
    count = {c: max(4 * c, args.min_requests) for c in levels}
    work = prompts(max(count.values()), config["vocab_size"])

    began = time.perf_counter()
    engine = Engine(folder, max_batch=args.max_batch, max_tokens_in_cache=args.max_batch * 256)
    built = time.perf_counter() - began
    began = time.perf_counter()
    engine.warmup()
    warm = time.perf_counter() - began
    placed = {str(d) for page in engine.runner.pages for d in page.devices()}  # the KV cache's device
    check = fixture_check(engine, folder)
    began = time.perf_counter()
    alone, alone_wall = engine_level(engine, work, 1, args.max_tokens)
    reference = {tuple(r["prompt"]): r["tokens"] for r in alone}
    lines.append(f"{name}: engine built {built:.1f} s, warmup (every program shape compiled) {warm:.1f} s, "
                 f"KV cache on {sorted(placed)}; onnxruntime-genai's stored greedy tokens: {check}; "
                 f"single-request reference pass {time.perf_counter() - began:.1f} s")
    print(lines[-1], flush=True)
    for c in levels:
        if time.perf_counter() - start > args.deadline:
            lines.append(f"{name}: concurrency {c} skipped: past the {args.deadline:.0f} s deadline")
            print(lines[-1], flush=True)
            continue
        records, wall = engine_level(engine, work[: count[c]], c, args.max_tokens)
        firsts = [r["first"] - r["submit"] for r in records]
        gaps = [b - a for r in records for a, b in zip(r["times"], r["times"][1:])]
        tokens = sum(len(r["tokens"]) for r in records)
        rows.append((name, c, len(records), tokens, wall, tokens / wall, percentile(firsts, 0.5),
                     percentile(firsts, 0.99), percentile(gaps, 0.5), same(records, reference)))
        print(rows[-1], flush=True)
        report(lines, rows, start, args.out)


def report(lines: list, rows: list, start: float, out: str) -> str:
    """The notes, the table and the time so far; written to ``out/gpu_serve.md`` too (after every level, so a
    run stopped at its limit still leaves what it measured)."""
    table = ["| model | concurrency | requests | tokens | wall (s) | tokens/s | TTFT p50 / p99 (ms) | between tokens "
             "p50 (ms) | greedy = single-request |", "|---|---|---|---|---|---|---|---|---|"]
    for name, c, n, tokens, wall, rate, p50, p99, gap, equal in rows:
        table.append(f"| {name} | {c} | {n} | {tokens} | {wall:.2f} | {rate:.0f} | {1e3 * p50:.1f} / {1e3 * p99:.1f} "
                     f"| {1e3 * gap:.2f} | {'yes' if equal else 'NO'} |")
    text = "\n".join(lines + ["", *table, "", f"total {time.perf_counter() - start:.1f} s"])
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "gpu_serve.md"), "w") as f:
            f.write(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="llama_gqa,llama_gqa_int4",
                        help="folders under tests/data/genai (or paths), comma-separated")
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--min-requests", type=int, default=32, help="requests per level: max(4c, this)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--deadline", type=float, default=180,
                        help="seconds after which no new level starts (and no new model past half of it)")
    parser.add_argument("--out", default="", help="a folder for gpu_serve.md")
    args = parser.parse_args()
    start = time.perf_counter()

    import jax

    lines = [versions(), f"jax.devices(): {jax.devices()}",
             f"default backend: {jax.default_backend()}, device kind: {jax.devices()[0].device_kind}"]
    print("\n".join(lines), flush=True)
    rows: list = []
    for model in args.models.split(","):
        if time.perf_counter() - start > args.deadline / 2:
            lines.append(f"{model}: skipped: past half the {args.deadline:.0f} s deadline")
            print(lines[-1], flush=True)
            continue
        folder = model if os.path.isdir(model) else os.path.join(ROOT, "tests", "data", "genai", model)
        try:
            run_model(folder, args, start, rows, lines)
        except Exception as error:  # noqa: BLE001  (one model's failure is reported; the next still runs)
            lines.append(f"{model}: FAILED: {type(error).__name__}: {error}")
            print(lines[-1], flush=True)
        report(lines, rows, start, args.out)
    print("\n" + report(lines, rows, start, args.out).split("\n\n", 1)[1])


if __name__ == "__main__":
    main()
