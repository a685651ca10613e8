"""What streaming token by token costs, and the CLI's rate against the run's length (issue 29 item 3).

Two measures, in one process, on one CPU device, greedy:

- per token, wall and CPU: :class:`Generator` iteration (one decode step per call, each token on the host
  before the next step) against ``generate``'s path (16 steps per call), the same tokens, medians of
  ``--repeats`` runs of ``--tokens`` tokens after the first, the decode program compiled beforehand; the
  ratio streaming / 16-a-call;
- ``onnx2jax generate``'s printed rate at several ``--max-new-tokens``: the rate it prints (decode tokens over
  the decode time alone, the decode program compiled apart) and what the former formula gave from the same
  line (the decode program's compile counted in the decode time).

    python bench/bench_stream.py [--model tests/data/genai/llama_gqa] [--tokens 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"decode program (?P<program>[\d.]+)s \(.*\); decode (?P<n>\d+) tokens in (?P<ms>[\d.]+) ms: "
                  r"(?P<rate>[\d.]+) tokens/s")


def per_token(model: str, tokens: int, repeats: int) -> dict:
    from onnx2jax.runtime.generate import Generator
    from onnx2jax.runtime.decoder import DECODE_STEPS
    from onnx2jax.runtime.load import load

    decoder = load(model)
    prompt = [1, 17, 230]
    out: dict[str, list] = {"stream_wall": [], "stream_cpu": [], "chunk_wall": [], "chunk_cpu": []}
    sequences = {}
    for _ in range(repeats):
        for name, per_call in (("stream", 1), ("chunk", DECODE_STEPS)):
            generator = Generator(decoder, prompt, max_new_tokens=tokens + 1, eos_token_id=-1)
            generator.generate_next_token()
            generator.compile_decode()
            wall, cpu = time.perf_counter(), time.process_time()
            count = sum(1 for _ in generator._steps(per_call))
            out[f"{name}_wall"].append((time.perf_counter() - wall) / count * 1e6)
            out[f"{name}_cpu"].append((time.process_time() - cpu) / count * 1e6)
            sequences[name] = generator.sequences.tolist()
    row = {k: statistics.median(v) for k, v in out.items()}
    row["same_tokens"] = sequences["stream"] == sequences["chunk"]
    return row


def cli_rates(model: str, counts: list[int]) -> list[dict]:
    from onnx2jax.cli.app import main

    rows = []
    for count in counts:
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            main(["generate", model, "--prompt-ids", "1,17,230", "--max-new-tokens", str(count), "--eos", "-1",
                  "--no-cache"])
        found = LINE.search(buffer.getvalue())
        n, ms, program = int(found["n"]), float(found["ms"]), float(found["program"])
        rows.append({"max_new_tokens": count, "printed": float(found["rate"]), "former": n / (ms / 1e3 + program)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=os.path.join(ROOT, "tests", "data", "genai", "llama_gqa"))
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--counts", default="8,64,200")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    row = per_token(args.model, args.tokens, args.repeats)
    print(f"load {load:.1f}; {args.tokens} tokens, median of {args.repeats}; the same tokens: {row['same_tokens']}")
    print("| per token | streaming (1 step a call) | 16 steps a call | ratio |\n|---|---|---|---|")
    for kind in ("wall", "cpu"):
        a, b = row[f"stream_{kind}"], row[f"chunk_{kind}"]
        print(f"| {kind} (us) | {a:.0f} | {b:.0f} | {a / b:.2f}x |")
    print("\n| --max-new-tokens | printed tokens/s | former formula (compile in the decode time) |\n|---|---|---|")
    for r in cli_rates(args.model, [int(c) for c in args.counts.split(",")]):
        print(f"| {r['max_new_tokens']} | {r['printed']:.0f} | {r['former']:.0f} |")


if __name__ == "__main__":
    sys.exit(main())
