"""Pipeline training schedules: bubble against the analytic bound, and activation memory held per stage.

Usage: python bench/bench_pipeline_train.py [--microbatches 4] [--repeat 3]

Two tables.

1. **Schedules** (no model): each built schedule timed at unit costs (F = 1,
   B = 2, or I = W = 1 for zero-bubble; communication free) by
   ``pipeline_schedules.simulate``: its bubble next to the analytic one, and
   the most micro-batches each stage holds residuals for.
2. **Measured on tiny Llama** (tests/data/tiny_llama.onnx) cut by ``auto:S``
   into S = 2 and 4 stages, one fake CPU device per stage, M micro-batches of
   batch 8 x 16 tokens: the driver's count of micro-batches whose residuals
   each stage held at once (``PipelineGrad.peak_held``) times one
   micro-batch's residual bytes (the VJP closure's leaves) is the activation
   memory per stage; and the time of one gradient (best of ``--repeat``)
   against the single program's ``value_and_grad`` on one device, timed
   alternately in the same run.

What fake CPU devices show: the schedule's order and memory, exactly. What
they do not show: the overlap of stages (every fake device shares the
host's cores and one XLA client), so a step's time on them is dispatch and
compute in series: its ratio against one program is no measure of the bubble.
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime import pipeline_schedules as ps  # noqa: E402
from sharding.annotate import add_configuration, set_stage  # noqa: E402
from sharding.stages import auto_stages  # noqa: E402

import pathlib  # noqa: E402

MODEL = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama.onnx"
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")


def schedule_table(pairs) -> list[str]:
    rows = ["| S | M | schedule | simulated bubble | analytic | micro-batches held per stage |", "|---|---|---|---|---|---|"]
    for stages, micro in pairs:
        for name in SCHEDULES:
            sim = ps.simulate(ps.build(name, list(range(stages)), micro))
            rows.append(f"| {stages} | {micro} | {name} | {sim.bubble:.3f} | {ps.analytic_bubble(name, stages, micro):.3f} "
                        f"| {list(sim.peak_held)} |")
        ranks, virtual = stages, 2
        sim = ps.simulate(ps.build("interleaved-1f1b", [s % ranks for s in range(ranks * virtual)], micro))
        rows.append(f"| {stages} (x{virtual} virtual) | {micro} | interleaved-1f1b | {sim.bubble:.3f} | "
                    f"{ps.analytic_bubble('interleaved-1f1b', ranks, micro, virtual):.3f} | {list(sim.peak_held)} (per rank) |")
    return rows


def staged(stages: int) -> onnx.ModelProto:
    model = onnx.load(MODEL)
    stage_of, _ = auto_stages(model, stages)
    add_configuration(model, "pp", stages)
    for node, stage in stage_of.items():
        set_stage(model, node, stage, "pp")
    return model


def loss_fn(outputs, weights):
    return jnp.sum(outputs[0] * weights)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return min(times)


def measured_table(micro: int, repeat: int) -> list[str]:
    ids = np.random.default_rng(0).integers(0, 256, (8, 16)).astype(np.int64)
    single = onnx2jax.compile(str(MODEL), scan_layers=False)
    weights = np.random.default_rng(1).normal(size=(8, 16, 256)).astype(np.float32)
    one = single.value_and_grad(loss_fn)
    one_params = {k: single.params[k] for k in single.trainable}
    rows = ["| S | M | schedule | micro-batches held per stage | activation MiB per stage | step time / one program |",
            "|---|---|---|---|---|---|"]
    for stages in (2, 4):
        pipeline = onnx2jax.compile(staged(stages), microbatches=micro, scan_layers=False)
        grad = pipeline.value_and_grad(loss_fn)
        params = {k: pipeline.params[k] for k in pipeline.trainable}
        for name in SCHEDULES:
            pipeline.schedule = name
            jax.block_until_ready(grad(params, ids, loss_args=(weights,)))  # compile
            jax.block_until_ready(one(one_params, ids, loss_args=(weights,)))
            ratios = []
            for _ in range(repeat):  # alternated: the same machine noise hits both
                t_pipe = best(lambda: grad(params, ids, loss_args=(weights,)), 1)
                t_one = best(lambda: one(one_params, ids, loss_args=(weights,)), 1)
                ratios.append(t_pipe / t_one)
            mib = [h * b / 2**20 for h, b in zip(grad.peak_held, grad.residual_bytes)]
            rows.append(f"| {stages} | {micro} | {name} | {grad.peak_held} | {', '.join(f'{x:.2f}' for x in mib)} "
                        f"| {min(ratios):.2f}-{max(ratios):.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    print("\n".join(schedule_table([(2, 4), (4, 4), (4, 8), (4, 16)])))
    print()
    print("\n".join(measured_table(args.microbatches, args.repeat)))


if __name__ == "__main__":
    main()
