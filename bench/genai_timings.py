"""onnxruntime-genai's side of ``bench/bench_generate.py``: greedy generation timed, as one JSON line.

Runs in a virtualenv with onnxruntime-genai (``/work/venvs/fixtures``; no jax there), called by
bench_generate.py as a subprocess with the same prompt, max_length and repeats as its onnx2jax side.
Per repeat: time to first token (a new ``Generator`` made, the prompt appended, which runs the prefill
and chooses the first token, up to its first ``get_next_tokens``), then the decode steps to
``is_done()``, one ``generate_next_token`` each (wall and process CPU time). The tokens of the last
repeat are returned, so that the caller checks both runtimes generated the same ones.

    python bench/genai_timings.py FOLDER --prompt 1,17,230 --max-length 128 --repeats 20 [--warmup 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime_genai as og


def run_once(model: og.Model, prompt: list[int], max_length: int) -> tuple[float, float, float, int, list[int]]:
    """(time to first token s, decode s, decode process CPU s, decode steps, tokens) of one greedy generation."""
    start = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    generator.get_next_tokens()
    first = time.perf_counter()
    cpu = time.process_time()
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        generator.get_next_tokens()
        steps += 1
    end = time.perf_counter()
    return first - start, end - first, time.process_time() - cpu, steps, [int(t) for t in generator.get_sequence(0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("folder")
    parser.add_argument("--prompt", required=True, help="comma-separated token ids")
    parser.add_argument("--max-length", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    start = time.perf_counter()
    model = og.Model(args.folder)
    load = time.perf_counter() - start
    for _ in range(args.warmup):
        run_once(model, prompt, args.max_length)
    runs = [run_once(model, prompt, args.max_length) for _ in range(args.repeats)]
    print(json.dumps({
        "version": og.__version__,
        "load_s": load,
        "ttft_s": [r[0] for r in runs],
        "decode_s": [r[1] for r in runs],
        "decode_cpu_s": [r[2] for r in runs],
        "steps": [r[3] for r in runs],
        "tokens": runs[-1][4],
    }))


if __name__ == "__main__":
    main()
