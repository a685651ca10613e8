"""Server soak (issue 40, item 7): ``onnx2jax serve`` under 32 concurrent streams for minutes, with random aborts,
dropped connections and bad requests mixed in, on 127.0.0.1.

Each of ``--concurrency`` client threads loops until the deadline, choosing per request (seeded):

- ``stream`` (45%): a streamed completion read to ``[DONE]``; its ``token_ids`` must equal the reference, which is
  the same prompt's greedy answer sent alone before the soak, its finish reason and usage present;
- ``whole`` (15%): the same, not streamed;
- ``abort`` (15%): a streamed completion of 64 tokens closed after 1 to 5 events;
- ``drop`` (10%): a raw socket that sends a request (whole, or its body cut short) and closes without reading
  the answer, or after its first bytes;
- ``bad`` (15%): a request the API refuses (a body that is not JSON, an unknown model, a wrong type, a prompt
  past the context, ``n`` 2, an unknown field), whose status must be the 4xx the API documents.

Measured: requests by kind and status, 5xx (must be 0), lost (a ``stream`` or ``whole`` request without its full,
reference answer: must be 0), the server's KV pages and slots in use once the load stops (``/metrics``: must
reach 0), and the server's resident memory (``/proc/PID/status`` VmRSS every 2 s): growth after warm-up is the
highest sample after the warm-up (the first fifth of the run) over the highest during it, minus 1 (must be
<= 5%). Bounded: every loop ends at the deadline, every request has a timeout.

    python bench/bench_soak.py [--duration 600] [--concurrency 32] [--model tests/data/genai/llama_gqa]
        [--out bench/results/soak.md]

``tests/onnx2jax/test_serving_soak.py`` (``slow``) runs :func:`soak` for about 2 minutes and asserts the same.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "soak"
CONTEXT = 128
POOL = 24  # distinct prompts, each with its own max_tokens: the references
WEIGHTS = {"stream": 45, "whole": 15, "abort": 15, "drop": 10, "bad": 15}
LISTENING = re.compile(r"onnx2jax serve: \S+ on http://127\.0\.0\.1:(\d+)/v1")
REQUEST_TIMEOUT_S = 120


def start_server(folder: str, max_batch: int, log: str, start_s: float = 600) -> tuple[subprocess.Popen, str]:
    """``onnx2jax serve folder`` on 127.0.0.1, port 0 (the server binds a free one and announces it); returns
    once ``/health`` answers 200. Its output goes to ``log`` (a file: no pipe to fill)."""
    import httpx

    env = {**os.environ, "PYTHONPATH": ROOT}
    command = [sys.executable, "-c", "import sys; from onnx2jax.cli import main; sys.exit(main())", "serve", folder,
               "--port", "0", "--max-batch", str(max_batch), "--queue-bound", "64", "--context-length", str(CONTEXT),
               "--served-model-name", MODEL]
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{open(log).read()}")
        found = LISTENING.search(open(log).read())
        if found:
            url = f"http://127.0.0.1:{found.group(1)}"
            try:
                if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise RuntimeError(f"the server was not ready within {start_s} s:\n{open(log).read()}")


def gauges(url: str) -> dict[str, float]:
    """The server's ``/metrics`` gauges and counters, by name (labels kept in the name)."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def rss_bytes(pid: int) -> int:
    """A process's resident memory (VmRSS), from /proc."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def _pool(seed: int) -> list[tuple[list[int], int]]:
    """(prompt token ids, max_tokens) of each pooled request: prompts of 4 to 40 tokens, 4 to 32 new tokens."""
    rng = random.Random(seed)
    return [([1] + [rng.randrange(4, 512) for _ in range(rng.randrange(3, 40))], rng.randrange(4, 33))
            for _ in range(POOL)]


def _tokens_of_stream(response) -> tuple[list[int], str | None, dict | None, bool]:
    """The token ids, finish reason, usage and whether ``[DONE]`` came, of a streamed completion."""
    tokens, finish, usage, done = [], None, None, False
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        for choice in event["choices"]:
            tokens += choice["token_ids"]
            finish = choice["finish_reason"] or finish
    return tokens, finish, usage, done


BAD = [  # (body bytes, expected status)
    (b"{not json", 400),
    (json.dumps({"model": "no-such-model", "prompt": [1, 5], "max_tokens": 2}).encode(), 404),
    (json.dumps({"model": MODEL, "prompt": [1, 5], "max_tokens": "two"}).encode(), 400),
    (json.dumps({"model": MODEL, "prompt": [1] * 120, "max_tokens": 20}).encode(), 400),
    (json.dumps({"model": MODEL, "prompt": [1, 5], "max_tokens": 2, "n": 2}).encode(), 400),
    (json.dumps({"model": MODEL, "prompt": [1, 5], "max_tokens": 2, "no_such_field": 1}).encode(), 400),
]


class Soak:
    """The client side of one soak: the threads' loops, their counts and failures."""

    def __init__(self, url: str, references: dict[int, list[int]], pool: list, deadline: float, seed: int):
        import httpx

        self.url, self.references, self.pool, self.deadline, self.seed = url, references, pool, deadline, seed
        self.client = httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, limits=httpx.Limits(max_connections=64))
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.statuses: collections.Counter = collections.Counter()
        self.failures: list[str] = []
        self.tokens = 0

    def _fail(self, kind: str, message: str) -> None:
        with self.lock:
            self.counts[f"{kind}_lost" if kind in ("stream", "whole") else f"{kind}_failed"] += 1
            if len(self.failures) < 20:
                self.failures.append(f"{kind}: {message}")

    def _status(self, status: int) -> None:
        with self.lock:
            self.statuses[status] += 1

    def _check(self, kind: str, index: int, tokens: list[int], finish, usage, done: bool) -> None:
        want = self.references[index]
        if not done or finish not in ("length", "stop") or tokens != want or (
                usage is not None and usage["completion_tokens"] != len(tokens)):
            self._fail(kind, f"prompt {index}: done {done}, finish {finish}, {len(tokens)} tokens {tokens[:8]}..., "
                             f"reference {len(want)} {want[:8]}..., usage {usage}")
            return
        with self.lock:
            self.counts[f"{kind}_ok"] += 1
            self.tokens += len(tokens)

    def one(self, rng: random.Random) -> None:
        kind = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
        index = rng.randrange(len(self.pool))
        prompt, max_tokens = self.pool[index]
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}
        with self.lock:
            self.counts[kind] += 1
        try:
            if kind == "stream":
                body.update(stream=True, stream_options={"include_usage": True})
                with self.client.stream("POST", "/v1/completions", json=body) as response:
                    self._status(response.status_code)
                    if response.status_code != 200:
                        return self._fail(kind, f"status {response.status_code}: {response.read()[:200]!r}")
                    self._check(kind, index, *_tokens_of_stream(response))
            elif kind == "whole":
                response = self.client.post("/v1/completions", json=body)
                self._status(response.status_code)
                if response.status_code != 200:
                    return self._fail(kind, f"status {response.status_code}: {response.text[:200]}")
                reply = response.json()
                choice = reply["choices"][0]
                self._check(kind, index, choice["token_ids"], choice["finish_reason"], reply["usage"], True)
            elif kind == "abort":
                body.update(stream=True, max_tokens=64)
                with self.client.stream("POST", "/v1/completions", json=body) as response:
                    self._status(response.status_code)
                    if response.status_code != 200:
                        return self._fail(kind, f"status {response.status_code}")
                    events, wanted = 0, rng.randrange(1, 6)
                    for line in response.iter_lines():
                        events += line.startswith("data: ")
                        if events >= wanted:
                            break  # leaving the block closes the connection mid-stream
            elif kind == "drop":
                self._drop(rng, body)
            else:
                payload, expected = rng.choice(BAD)
                response = self.client.post("/v1/completions", content=payload,
                                            headers={"content-type": "application/json"})
                self._status(response.status_code)
                if response.status_code != expected:
                    return self._fail(kind, f"{payload[:60]!r}: status {response.status_code}, expected {expected}")
                with self.lock:
                    self.counts["bad_ok"] += 1
        except Exception as error:  # noqa: BLE001 - any client-side error is a lost or failed request, counted
            self._fail(kind, f"{type(error).__name__}: {error}")

    def _drop(self, rng: random.Random, body: dict) -> None:
        """A connection that goes away: the whole request sent and closed unread, or after the first bytes, or
        its body cut short."""
        body = {**body, "stream": rng.random() < 0.5, "max_tokens": 64}
        payload = json.dumps(body).encode()
        host, port = self.url.removeprefix("http://").split(":")
        how = rng.choice(["unread", "first_bytes", "cut_body"])
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n").encode()
        with socket.create_connection((host, int(port)), timeout=REQUEST_TIMEOUT_S) as sock:
            sock.sendall(head + (payload[: len(payload) // 2] if how == "cut_body" else payload))
            if how == "first_bytes":
                sock.recv(64)
        with self.lock:
            self.counts[f"drop_{how}"] += 1

    def loop(self, worker: int) -> None:
        rng = random.Random(self.seed * 1000 + worker)
        while time.monotonic() < self.deadline:
            self.one(rng)


def soak(folder: str, duration_s: float, concurrency: int = 32, max_batch: int = 16, seed: int = 0,
         warmup_fraction: float = 0.2, log: str | None = None) -> dict:
    """Starts a server on ``folder``, soaks it for ``duration_s`` seconds with ``concurrency`` client threads,
    waits for it to drain, stops it, and returns the figures (see the module docstring)."""
    import httpx

    log = log or os.path.join(tempfile.mkdtemp(prefix="soak"), "server.log")
    process, url = start_server(folder, max_batch, log)
    try:
        pool = _pool(seed)
        references = {}
        for index, (prompt, max_tokens) in enumerate(pool):  # each alone: the answer every later copy must give
            reply = httpx.post(f"{url}/v1/completions", timeout=REQUEST_TIMEOUT_S,
                               json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens}).json()
            references[index] = reply["choices"][0]["token_ids"]
        samples: list[tuple[float, int]] = []
        start = time.monotonic()
        client = Soak(url, references, pool, start + duration_s, seed)
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                samples.append((time.monotonic() - start, rss_bytes(process.pid)))
                stop.wait(2.0)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        threads = [threading.Thread(target=client.loop, args=(w,), daemon=True) for w in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(duration_s + 2 * REQUEST_TIMEOUT_S)
        hung = sum(thread.is_alive() for thread in threads)
        stop.set()
        sampler.join()
        loaded = time.monotonic() - start
        drained, final = None, {}
        drain_start = time.monotonic()
        while time.monotonic() - drain_start < 60:
            final = gauges(url)
            if all(final.get(f"onnx2jax_{k}", 1) == 0 for k in ("slots_used", "cache_pages_used",
                                                                 "requests_running", "requests_waiting")):
                drained = time.monotonic() - drain_start
                break
            time.sleep(0.5)
        client.client.close()
        alive = process.poll() is None
    finally:
        process.kill()
        process.wait()
    warm = warmup_fraction * duration_s
    during = [r for t, r in samples if t <= warm]
    after = [r for t, r in samples if t > warm]
    counts = dict(client.counts)
    return {
        "duration_s": duration_s, "loaded_s": loaded, "concurrency": concurrency, "max_batch": max_batch,
        "counts": counts, "statuses": {str(k): v for k, v in sorted(client.statuses.items())},
        "server_errors": sum(v for k, v in client.statuses.items() if k >= 500),
        "lost": counts.get("stream_lost", 0) + counts.get("whole_lost", 0),
        "failed": sum(v for k, v in counts.items() if k.endswith("_failed")),
        "failures": client.failures, "hung_threads": hung, "tokens": client.tokens,
        "tokens_per_s": client.tokens / loaded,
        "drained_after_s": drained, "pages_used": final.get("onnx2jax_cache_pages_used"),
        "pages_total": final.get("onnx2jax_cache_pages_total"), "slots_used": final.get("onnx2jax_slots_used"),
        "server_counters": {k: v for k, v in final.items() if k.startswith("onnx2jax_requests_total")},
        "rss_warm_peak": max(during) if during else None, "rss_after_peak": max(after) if after else None,
        "rss_end": samples[-1][1] if samples else None, "rss_samples": len(samples),
        "rss_growth": (max(after) / max(during) - 1) if during and after else None,
        "rss_median_after": statistics.median(after) if after else None,
        "server_alive": alive, "log": log,
    }


def markdown(figures: dict) -> str:
    """The figures as the bench/RESULTS.md section's table."""
    mib = 1 << 20
    c = figures["counts"]
    rows = [
        ("duration (s) / clients / slots", f"{figures['duration_s']:.0f} / {figures['concurrency']} / "
                                           f"{figures['max_batch']}"),
        ("requests: stream / whole / abort / drop / bad", " / ".join(str(c.get(k, 0)) for k in WEIGHTS)),
        ("answered in full and equal to the reference", f"{c.get('stream_ok', 0) + c.get('whole_ok', 0)}"),
        ("lost (no full reference answer)", str(figures["lost"])),
        ("bad requests with the documented 4xx", f"{c.get('bad_ok', 0)} of {c.get('bad', 0)}"),
        ("other client failures", str(figures["failed"])),
        ("HTTP statuses", ", ".join(f"{k}: {v}" for k, v in figures["statuses"].items())),
        ("5xx", str(figures["server_errors"])),
        ("tokens generated (checked answers) / per s", f"{figures['tokens']} / {figures['tokens_per_s']:.0f}"),
        ("KV pages used after the load (of total)", f"{figures['pages_used']:.0f} of {figures['pages_total']:.0f}, "
                                                    f"drained {figures['drained_after_s']:.1f} s after"),
        ("RSS peak in warm-up / after / growth", f"{figures['rss_warm_peak'] / mib:.0f} MiB / "
                                                 f"{figures['rss_after_peak'] / mib:.0f} MiB / "
                                                 f"{100 * figures['rss_growth']:+.2f}%"),
    ]
    return "| figure | value |\n|---|---|\n" + "".join(f"| {a} | {b} |\n" for a, b in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "tests", "data", "genai", "llama_gqa"))
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "soak.md"))
    args = parser.parse_args()
    figures = soak(args.model, args.duration, args.concurrency, args.max_batch, args.seed)
    table = markdown(figures)
    print(table)
    print(json.dumps({k: v for k, v in figures.items() if k != "failures"}, indent=1))
    for failure in figures["failures"]:
        print("failure:", failure)
    with open(args.out, "w") as out:
        out.write(f"# Server soak ({time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f})\n\n"
                  f"`python bench/bench_soak.py --duration {args.duration:.0f} --concurrency {args.concurrency}`\n\n"
                  + table + "\n```json\n" + json.dumps(figures, indent=1) + "\n```\n")


if __name__ == "__main__":
    main()
