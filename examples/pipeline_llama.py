"""Pipeline-parallel Llama on 8 fake CPU devices: stages cut -> TP inside each stage -> run in micro-batches.

Runs on the shipped fixture, nothing else needed:

    python examples/pipeline_llama.py [--stages 2] [--tp 4] [--microbatches 4] [--batch 8]

The tiny Llama (tests/data/tiny_llama.onnx, 2 layers) is cut automatically
into S stages where only the residual stream crosses, each stage on its own
group of ``tp`` devices with the Megatron plan inside the group, written into
the model as ``pipeline_stage`` (what ``onnx2jax annotate --stages auto:S
--devices N --plan megatron`` does). ``onnx2jax.compile`` then runs one SPMD
program per stage on its sub-mesh, the batch split into micro-batches in a
fill-drain schedule. The logits are compared with the unsharded run and the
per-stage report is printed.
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import onnx2jax  # noqa: E402
from sharding.stages import StageAssignment, annotate_stages, auto_stages  # noqa: E402

LLAMA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama.onnx"


def staged_llama(stages: int, tp: int) -> onnx.ModelProto:
    """tiny Llama in ``stages`` stages of ``tp`` devices each, Megatron inside each stage."""
    model = onnx.load(LLAMA)
    stage_of, cut = auto_stages(model, stages)
    for line in cut.describe():
        print(line)
    assignment = StageAssignment.one_group_per_stage(stage_of)
    return annotate_stages(model, assignment, stages * tp, "pp", tensor_parallel=tp > 1)


def main(argv: Sequence[str] | None = None) -> float:
    """Runs the example; returns max |pipelined - unsharded| of the logits."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--tp", type=int, default=4, help="devices per stage (tensor parallel inside it)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args(argv)
    if args.stages * args.tp > len(jax.devices()):
        raise SystemExit(f"{args.stages} stages x {args.tp} devices need more than {len(jax.devices())} devices")
    compiled = onnx2jax.compile(staged_llama(args.stages, args.tp), microbatches=args.microbatches)
    input_ids = np.random.default_rng(0).integers(0, 256, (args.batch, 16)).astype(np.int64)
    (logits,) = compiled(input_ids)
    (unsharded,) = onnx2jax.translate(str(LLAMA))(input_ids)
    compiled.report().render()
    error = float(np.abs(np.asarray(logits) - np.asarray(unsharded)).max())
    print(f"logits {tuple(logits.shape)}: max |pipelined - unsharded| = {error:.3g}")
    return error


if __name__ == "__main__":
    main()
