"""Serving load test (issue 29): onnx2jax serve through the openai client vs onnxruntime-genai, on 127.0.0.1.

For each concurrency c (closed loop: c clients, each sending its next request when its last one ends) the same
requests (prompts of mixed lengths, seeded; greedy; ``--max-tokens`` each) go through:

- ``onnx2jax serve`` (a subprocess on a free 127.0.0.1 port) with the ``openai`` client, streaming, and again
  with ``httpx`` reading the events and ``json.loads`` each (no pydantic object per event: the difference is
  the ``openai`` client's own cost, on the same cores as the server);
- onnx2jax's :class:`~onnx2jax.serving.Engine` in this process (no HTTP: what the server costs on top; its
  programs compiled by ``Engine.warmup`` first, as the server compiles them before it listens; XLA's CPU
  settings as ``onnx2jax serve`` chooses them: synchronous dispatch, and its intra-op threads, one for a small
  model; ``--async-dispatch`` and ``--cpu-threads`` change them, and the rows' label says which ran): a token to
  the host every step, as the server streams; and with ``--decode-steps K`` > 1, ``Engine(decode_steps=K)``: K
  decode steps a call where nobody waits to be admitted (tokens in bursts of up to K: batch work, not streaming);
- onnxruntime-genai's generator, one request at a time, and its ``Engine`` (continuous batching, 0.9+) with c
  requests in flight, in a worker process of a Python that has onnxruntime_genai (``--og-python``).

Reported: aggregate generated tokens/s (all tokens over the level's wall time) and per CPU second of the process
that generates them (the in-process Engine, onnxruntime-genai's worker; its threads included: a figure the
load of a shared machine moves less), time to first token p50/p99
(from a request's submission, queueing included), time between tokens p50/p99 (as the client receives them),
requests lost (any that did not end with all its tokens), and whether every request's greedy tokens equal the
single-request run's (the concurrency-1 server run). Bounded: ``--requests`` per level (default 4c, at least 32)
and ``--timeout`` seconds per level.

    python bench/bench_serve.py [--model tests/data/genai/llama_gqa] [--og-python /work/venvs/fixtures/bin/python]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def prompts(count: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Prompts of mixed lengths (4 to 96 tokens), ids in [4, vocab), seeded."""
    import random

    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, vocab) for _ in range(rng.choice([3, 7, 15, 31, 63, 95]))] for _ in range(count)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def summarize(records: list[dict], wall: float, expected: int, cpu: float = float("nan")) -> dict:
    """Aggregate figures of one level: records have submit, first, times (per token), tokens, finish (None:
    the request never ended: lost)."""
    tokens = sum(len(r["tokens"]) for r in records)
    gaps = [b - a for r in records for a, b in zip(r["times"], r["times"][1:])]
    return {"tok_s": tokens / wall, "ttft_p50": percentile([r["first"] - r["submit"] for r in records], 0.5),
            "ttft_p99": percentile([r["first"] - r["submit"] for r in records], 0.99),
            "itl_p50": percentile(gaps, 0.5), "itl_p99": percentile(gaps, 0.99),
            "lost": expected - sum(1 for r in records if r["finish"] is not None), "requests": len(records),
            "wall": wall, "tok_cpu_s": tokens / cpu}


def process_cpu(pid: int) -> float:
    """CPU seconds a process has used (user and system, all its threads), from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def closed_loop(work: list, concurrency: int, one) -> tuple[list, float]:
    """Runs ``one(item)`` for every item with ``concurrency`` at a time; returns the results and the wall time."""
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, work))
    return results, time.perf_counter() - start


# ---- onnx2jax serve through the openai client


def start_server(model: str, max_batch: int, queue_bound: int, threads: int | None) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": ROOT}
    command = [sys.executable, "-c", "import sys; from onnx2jax.cli import main; sys.exit(main())", "serve", model,
               "--port", str(port), "--max-batch", str(max_batch), "--queue-bound", str(queue_bound)]
    command += ["--cpu-threads", str(threads)] if threads is not None else []
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("the server did not start")


def server_level(url: str, name: str, work: list[list[int]], concurrency: int, max_tokens: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)

    def one(prompt):
        record = {"submit": time.perf_counter(), "times": [], "tokens": [], "prompt": prompt, "finish": None}
        stream = client.completions.create(model=name, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                           stream=True)
        for event in stream:
            ids = event.choices[0].token_ids if event.choices else []
            for token in ids:
                record["times"].append(time.perf_counter())
                record["tokens"].append(token)
            if event.choices and event.choices[0].finish_reason:
                record["finish"] = event.choices[0].finish_reason
        record["first"] = record["times"][0] if record["times"] else float("nan")
        return record

    return closed_loop(work, concurrency, one)


def httpx_level(url: str, name: str, work: list[list[int]], concurrency: int, max_tokens: int) -> list[dict]:
    """As :func:`server_level`, with ``httpx`` streaming the response and ``json.loads`` of each event instead
    of the ``openai`` client (which builds a pydantic object per event): how much of the server's figure is the
    client's."""
    import httpx

    client = httpx.Client(base_url=url, timeout=600, limits=httpx.Limits(max_connections=concurrency))

    def one(prompt):
        record = {"submit": time.perf_counter(), "times": [], "tokens": [], "prompt": prompt, "finish": None}
        body = {"model": name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
        with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[6:])["choices"]
                for token in choices[0]["token_ids"] if choices else []:
                    record["times"].append(time.perf_counter())
                    record["tokens"].append(token)
                if choices and choices[0]["finish_reason"]:
                    record["finish"] = choices[0]["finish_reason"]
        record["first"] = record["times"][0] if record["times"] else float("nan")
        return record

    try:
        return closed_loop(work, concurrency, one)
    finally:
        client.close()


# ---- onnx2jax's Engine in this process


def engine_level(engine, work: list[list[int]], concurrency: int, max_tokens: int) -> tuple[list[dict], float, float]:
    from onnx2jax.serving import SamplingParams

    pending = list(work)
    records, live = [], {}
    start, cpu = time.perf_counter(), time.process_time()
    while pending or live:
        while pending and len(live) < concurrency:
            prompt = pending.pop(0)
            rid = engine.add_request(prompt, SamplingParams(max_tokens=max_tokens))
            live[rid] = {"submit": time.perf_counter(), "times": [], "tokens": [], "prompt": prompt}
        out = engine.step()
        now = time.perf_counter()
        for rid, tokens in out.items():
            live[rid]["times"] += [now] * len(tokens)
            live[rid]["tokens"] += tokens
        for rid in [r for r in live if engine.finish_reason(r) is not None]:
            record = live.pop(rid)
            record["first"] = record["times"][0] if record["times"] else float("nan")
            record["finish"] = engine.finish_reason(rid)
            records.append(record)
            engine.release(rid)
    return records, time.perf_counter() - start, time.process_time() - cpu


# ---- onnxruntime-genai, in a worker process (its own Python)


OG_WORKER = r'''
import json, sys, time
import numpy as np
import onnxruntime_genai as og
spec = json.loads(sys.stdin.read())
model = og.Model(spec["model"])
out = {}
eos = set(spec["eos"])
def record(submit, prompt):
    return {"submit": submit, "times": [], "tokens": [], "prompt": prompt, "finish": None}
if spec["mode"] == "generator":
    records = []
    start, cpu = time.perf_counter(), time.process_time()
    for prompt in spec["work"]:
        r = record(time.perf_counter(), prompt)
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + spec["max_tokens"], do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            if token in eos:  # returned by the generator; onnx2jax and OpenAI do not return it
                break
            r["times"].append(time.perf_counter()); r["tokens"].append(token)
        r["finish"] = "done"
        records.append(r)
    wall = time.perf_counter() - start
else:
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(4096)
    pending, live, records = list(spec["work"]), {}, []
    start, cpu = time.perf_counter(), time.process_time()
    while pending or live:
        while pending and len(live) < spec["concurrency"]:
            request = engine.create_request()
            options = og.TurnOptions(request)
            options.set_max_generated_tokens(spec["max_tokens"])
            options.set_do_sample(False)
            prompt = pending.pop(0)
            request.begin_turn(np.array(prompt, np.int32), options)
            live[id(request)] = (request, record(time.perf_counter(), prompt))
        engine.run(buffer)
        now = time.perf_counter()
        for event in buffer:
            entry = live.get(id(event.request))
            if entry is None:
                continue
            if event.flags & og.EngineEventFlags.TOKEN and int(event.token) not in eos:
                entry[1]["times"].append(now); entry[1]["tokens"].append(int(event.token))
            if event.flags & og.EngineEventFlags.FAILED:
                live.pop(id(event.request))
                records.append(entry[1])
            elif event.flags & og.EngineEventFlags.TURN_FINISHED:
                entry[1]["finish"] = str(event.finish_reason)
                live.pop(id(event.request))
                records.append(entry[1])
    wall = time.perf_counter() - start
for r in records:
    r["first"] = r["times"][0] if r["times"] else float("nan")
print(json.dumps({"records": records, "wall": wall, "cpu": time.process_time() - cpu, "version": og.__version__}))
'''


def og_level(python: str, model: str, mode: str, work, concurrency: int, max_tokens: int, timeout: float,
             eos: list[int]):
    spec = {"model": model, "mode": mode, "work": work, "concurrency": concurrency, "max_tokens": max_tokens,
            "eos": eos}
    done = subprocess.run([python, "-c", OG_WORKER], input=json.dumps(spec), capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    result = json.loads(done.stdout)
    return result["records"], result["wall"], result["cpu"], result["version"]


def same(records: list[dict], reference: dict) -> bool:
    """Every request's tokens equal the single-request run's of its prompt."""
    return all(r["tokens"] == reference[tuple(r["prompt"])] for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "tests", "data", "genai", "llama_gqa"))
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--requests", type=int, default=0, help="requests per level (default max(4c, 32))")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--og-python", default="", help="a Python with onnxruntime_genai (skipped without)")
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--decode-steps", type=int, default=16, help="the second in-process Engine's (1: none)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of the in-process and onnxruntime-genai "
                        "levels, in turn (the table then gives each row's median run by tokens/s)")
    parser.add_argument("--no-server", action="store_true", help="skip the HTTP server (the reference is then the "
                        "in-process Engine's concurrency-1 run)")
    parser.add_argument("--server-only", action="store_true", help="only the HTTP server's levels (no in-process "
                        "Engine, no onnxruntime-genai)")
    parser.add_argument("--cpu-threads", type=int, default=None, help="XLA's intra-op CPU threads, for the server "
                        "and the in-process Engine (default: as onnx2jax serve chooses: 1 for a small model)")
    parser.add_argument("--async-dispatch", action="store_true", help="the in-process Engine with XLA's "
                        "asynchronous CPU dispatch (default: synchronous, as onnx2jax serve runs)")
    args = parser.parse_args()
    from onnx2jax.cli.options import CPU_THREADS_ENV, limit_cpu_threads, serve_cpu_threads, synchronous_cpu_dispatch

    threads = serve_cpu_threads(args.model, args.cpu_threads, 1)
    if threads is not None:  # before JAX starts in this process, as serve sets it
        limit_cpu_threads(threads)
    if not args.async_dispatch:
        synchronous_cpu_dispatch()
    settings = (f"{'async' if args.async_dispatch else 'sync'} dispatch, "
                f"XLA CPU threads {os.environ.get(CPU_THREADS_ENV) or 'one per core'}")
    levels = [int(c) for c in args.levels.split(",")]
    config = json.load(open(os.path.join(args.model, "genai_config.json")))["model"]
    eos = config["eos_token_id"] if isinstance(config["eos_token_id"], list) else [config["eos_token_id"]]
    count = {c: args.requests or max(4 * c, 32) for c in levels}
    everything = prompts(max(count.values()), config["vocab_size"])
    print(f"load average before: {os.getloadavg()}", flush=True)
    rows = []

    def add(label, c, records, wall, equal, cpu=float("nan"), client_cpu=None):
        summary = summarize(records, wall, count[c], cpu)
        if client_cpu is not None:  # the label names the client's tokens per CPU second
            label = label.format(f"{summary['tok_s'] * summary['wall'] / client_cpu:.0f}")
        rows.append((label, c, summary, equal))
        print(rows[-1], flush=True)

    name = os.path.basename(os.path.normpath(args.model))
    reference = None
    if not args.no_server:
        process, url = start_server(args.model, args.max_batch, queue_bound=max(levels) * 2, threads=threads)
        try:
            records, _ = server_level(url, name, everything, 1, args.max_tokens)  # the single-request reference
            reference = {tuple(r["prompt"]): r["tokens"] for r in records}
            for c in levels:
                for label, level in (("openai client", server_level), ("httpx, SSE lines, json.loads", httpx_level)):
                    cpu, client_cpu = process_cpu(process.pid), time.process_time()
                    records, wall = level(url, name, everything[: count[c]], c, args.max_tokens)
                    cpu, client_cpu = process_cpu(process.pid) - cpu, time.process_time() - client_cpu
                    add(f"onnx2jax serve ({label}; tokens per the server's CPU s, the client's {{}})", c, records,
                        wall, same(records, reference), cpu, client_cpu)
        finally:
            process.terminate()
            process.wait(timeout=60)
    from onnx2jax.serving import Engine

    engines = {}
    if args.server_only:
        args.repeat = 0
    for steps in [] if args.server_only else sorted({1, args.decode_steps}):
        engines[steps] = Engine(args.model, max_batch=args.max_batch, max_tokens_in_cache=args.max_batch * 256,
                                decode_steps=steps)
        engines[steps].warmup()  # every program shape compiled before timing, as the server does before it listens
    if reference is None and engines:
        records, _, _ = engine_level(engines[1], everything, 1, args.max_tokens)
        reference = {tuple(r["prompt"]): r["tokens"] for r in records}
    for _ in range(args.repeat):  # ours and onnxruntime-genai's in turn, so that both meet the same load
        for c in levels:
            for steps, engine in engines.items():
                label = f"onnx2jax Engine (in process, {settings})" + ("" if steps == 1 else
                                                                       f", {steps} decode steps a call")
                records, wall, cpu = engine_level(engine, everything[: count[c]], c, args.max_tokens)
                add(label, c, records, wall, same(records, reference), cpu)
            for mode in ((["generator"] if c == 1 else []) + ["engine"]) if args.og_python else []:
                records, wall, cpu, version = og_level(args.og_python, args.model, mode, everything[: count[c]], c,
                                                       args.max_tokens, args.timeout, eos)
                label = f"onnxruntime-genai {version} " + ("generator, one at a time" if mode == "generator" else "Engine")
                add(label, c, records, wall, same(records, reference), cpu)
    print(f"load average after: {os.getloadavg()}")
    print("\n| runtime | concurrency | requests | tokens/s | tokens / CPU s | TTFT p50 / p99 (ms) "
          "| between tokens p50 / p99 (ms) | lost | greedy = single-request |")
    print("|---|---|---|---|---|---|---|---|---|")
    runs: dict[tuple[str, int], list] = {}
    for label, c, s, equal in rows:
        runs.setdefault((label, c), []).append((s, equal))
    for (label, c), found in runs.items():  # the median run of each row by tokens/s
        s, equal = sorted(found, key=lambda r: r[0]["tok_s"])[len(found) // 2]
        equal = all(e for _, e in found)
        per_cpu = "-" if s["tok_cpu_s"] != s["tok_cpu_s"] else f"{s['tok_cpu_s']:.0f}"
        print(f"| {label} | {c} | {s['requests']} | {s['tok_s']:.0f} | {per_cpu} | {1e3 * s['ttft_p50']:.1f} / "
              f"{1e3 * s['ttft_p99']:.1f} | {1e3 * s['itl_p50']:.2f} / {1e3 * s['itl_p99']:.2f} | {s['lost']} | "
              f"{'yes' if equal else 'NO'} |")

if __name__ == "__main__":
    main()
