"""What the per-device stacks cost: zoo models under the Megatron plan with and without them.

``onnx2jax.runtime.stacks`` computes a column-parallel product from a stack
[n, ...] of its replicated input (shared where inputs fan out, with the
normalisations between run on it) and keeps row-parallel partial sums
stacked until they are added; the plain way is ``x @ W`` with XLA's
partitioning. Both give the same values; the stacks change only where the
backward's reductions happen. This times, per zoo model at TP 8 on 8 fake CPU
devices, the forward call (``compiled(**inputs)``) and one ``jit(grad(loss))``
step (gradients of every trainable parameter) in both modes, the callables of
a model called in a new random order each round, and reports medians, the
ratio stacks / plain, the all-reduce operands of each compiled program, and
whether the two gradient programs are the same HLO (then the ratio is the
machine's noise: no product of that model reads a shared stack or adds
partial sums).

    python bench/bench_column_stack.py [--repeats 50] [--models gpt_neox,mistral] [--output bench/results/column_stack.md]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import random
import re
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "onnx2jax"))
from train_helpers import jax_loss, output_weights, zoo_inputs, zoo_model  # noqa: E402
from zoo_cases import CASES  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime.constraints import ShardingHooks  # noqa: E402


@contextlib.contextmanager
def plain_products():
    """While tracing: every product as XLA partitions it (no stacks, no pending partial sums)."""
    saved = ShardingHooks._column_parallel, ShardingHooks._add_partials
    ShardingHooks._column_parallel = lambda self, *args: None
    ShardingHooks._add_partials = lambda self, *args: None
    try:
        yield
    finally:
        ShardingHooks._column_parallel, ShardingHooks._add_partials = saved


def _operands(text: str) -> int:
    return sum(m.count("%") for m in re.findall(r"=\s*[^=\n]*?\ball-reduce(?:-start)?\(([^)]*)\)", text))


def _program(text: str) -> str:
    """Compiled HLO's computations without metadata (source locations name the tracing code, not the program)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(("%", "ENTRY"))), 0)
    return re.sub(r", metadata=\{[^}]*\}", "", "\n".join(lines[start:]))


def _mode(name: str, plain: bool) -> tuple[Callable[[], object], Callable[[], object], int, int, str]:
    """(forward call, gradient step, forward all-reduce operands, gradient's, gradient's HLO) of ``name`` in one mode."""
    compiled = onnx2jax.compile(zoo_model(name, True))
    inputs, weights = zoo_inputs(name), output_weights(name)
    params = {k: compiled.params[k] for k in compiled.trainable}

    def forward(p):
        return compiled.apply({**compiled.params, **p}, **inputs)

    def loss(p):
        return jax_loss(forward(p), weights)

    with plain_products() if plain else contextlib.nullcontext(), jax.enable_x64(True):
        fwd = jax.jit(forward).lower(params).compile()
        grad = jax.jit(jax.grad(loss)).lower(params).compile()
    return (
        lambda: jax.block_until_ready(fwd(params)),
        lambda: jax.block_until_ready(grad(params)),
        _operands(fwd.as_text()),
        _operands(grad.as_text()),
        _program(grad.as_text()),
    )


def _medians(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    for fn in calls.values():
        for _ in range(3):
            fn()
    times = {k: [] for k in calls}
    names, rng = list(calls), random.Random(0)
    for _ in range(repeats):
        rng.shuffle(names)
        for key in names:
            start = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--models", default=",".join(n for n, c in CASES.items() if c.tp > 1))
    parser.add_argument("--output", type=pathlib.Path)
    args = parser.parse_args()
    rows = [
        f"zoo models, Megatron plan TP 8 on 8 fake CPU devices, median of {args.repeats} rounds "
        f"(load average {os.getloadavg()[0]:.1f} at start)",
        "",
        "| model | forward: stacks / plain (ms) | ratio | grad step: stacks / plain (ms) | ratio "
        "| all-reduce operands fwd, grad: stacks / plain | same programs |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in args.models.split(","):
        stacked, plain = _mode(name, False), _mode(name, True)
        m = _medians({"fs": stacked[0], "fp": plain[0], "gs": stacked[1], "gp": plain[1]}, args.repeats)
        rows.append(
            f"| {name} | {m['fs'] * 1e3:.2f} / {m['fp'] * 1e3:.2f} | {m['fs'] / m['fp']:.2f} "
            f"| {m['gs'] * 1e3:.2f} / {m['gp'] * 1e3:.2f} | {m['gs'] / m['gp']:.2f} "
            f"| {stacked[2]}, {stacked[3]} / {plain[2]}, {plain[3]} | {'yes' if stacked[4] == plain[4] else 'no'} |"
        )
        print(rows[-1], flush=True)
    rows.append(f"\nload average {os.getloadavg()[0]:.1f} at the end")
    if args.output:
        args.output.write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
