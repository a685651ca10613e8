"""One decode step's time against the cache's capacity (issue 28: the decode loop's cache copies).

Loads a model with its cache once (``onnx2jax.load``), prefills a 128-token prompt, lets the decode program
compile and run once, then times ``--steps`` one-step calls of it (as a streaming ``Generator`` makes them), for
each capacity (``max_length``). A decode step whose compiled loop copies the cache costs more as the cache grows;
run it from two checkouts in alternation to compare them:

    python bench/bench_decode_capacity.py --model /tmp/ttft_models/real_size/gpt2_cache/model.onnx
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # this checkout's onnx2jax

import onnx2jax  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a model with a KV cache (a torch export or a genai folder)")
    parser.add_argument("--capacities", default="160,1024", help="max_length of each run, comma-separated")
    parser.add_argument("--steps", type=int, default=24, help="one-step decode calls timed per capacity")
    args = parser.parse_args()
    model = onnx2jax.load(args.model)
    prompt = np.random.default_rng(28).integers(4, 30000, 128).tolist()
    for capacity in (int(c) for c in args.capacities.split(",")):
        tokens = iter(onnx2jax.Generator(model, prompt, max_length=capacity))
        next(tokens)  # the prefill
        next(tokens)  # the decode program compiled and run once
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.steps):
            next(tokens)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        print(f"capacity {capacity}: {1000 * wall / args.steps:.1f} ms a step, "
              f"{1000 * cpu / args.steps:.1f} ms of CPU a step", flush=True)


if __name__ == "__main__":
    main()
