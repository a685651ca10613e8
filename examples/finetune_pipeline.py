"""Fine-tune a decoder split into pipeline stages, with tensor parallelism inside each, by 1F1B.

    python examples/finetune_pipeline.py [--steps 20] [--microbatches 4] [--schedule 1f1b]

tiny Llama (tests/data/tiny_llama.onnx) is cut into 2 stages (``auto:2``), each
stage on its own 2 devices with the Megatron plan inside: 4 fake CPU devices.
Each step runs the schedule's forward and backward programs per micro-batch
(``compiled.value_and_grad``) and an optax Adam update per stage (parameters
and optimizer state stay on their stage's devices). The same steps run on the
unstaged model as one program; the losses and the trained parameters must
agree. The loss is next-token cross entropy on a counting task, summed over
the batch and divided by the number of predictions: its micro-batches add up
to the batch mean.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import optax  # noqa: E402

import onnx2jax  # noqa: E402
from onnx2jax.runtime.train_step import train_step  # noqa: E402
from sharding.stages import StageAssignment, annotate_stages, auto_stages  # noqa: E402

MODEL = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "tiny_llama.onnx"


def counting(rng: np.random.Generator, batch: int, length: int, vocab: int) -> np.ndarray:
    """``batch`` sequences ``t, t+1, ...`` (mod ``vocab``) from random starts."""
    return ((rng.integers(0, vocab, size=(batch, 1)) + np.arange(length)) % vocab).astype(np.int64)


def staged(stages: int, tp: int) -> onnx.ModelProto:
    model = onnx.load(MODEL)
    stage_of, _ = auto_stages(model, stages)
    return annotate_stages(model, StageAssignment.one_group_per_stage(stage_of), stages * tp, "pp", tensor_parallel=True)


def main(argv: list[str] | None = None) -> float:
    """Trains both ways; returns the largest difference of a trained parameter (pipeline vs one program)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b", help="gpipe, 1f1b, interleaved-1f1b or zero-bubble")
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args(argv)

    pipeline = onnx2jax.compile(staged(2, 2), microbatches=args.microbatches, schedule=args.schedule, scan_layers=False)
    single = onnx2jax.compile(str(MODEL), scan_layers=False)
    print(f"{len(pipeline.stages)} stages on devices {[list(s.devices) for s in pipeline.stages]}, "
          f"{args.microbatches} micro-batches, schedule {args.schedule}; {len(pipeline.trainable)} trainable tensors")
    predictions = args.batch * (args.length - 1)

    def loss_fn(outputs, ids):
        logits = outputs[0][:, :-1].astype(jnp.float32)
        return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).sum() / predictions

    optimizer = optax.adam(args.lr)
    results = []
    for executable in (pipeline, single):
        step = train_step(executable, loss_fn, optimizer)
        params = {k: executable.params[k] for k in executable.trainable}
        state = step.init(params)
        rng = np.random.default_rng(0)
        losses = []
        for _ in range(args.steps):
            ids = counting(rng, args.batch, args.length, 256)
            params, state, loss = step(params, state, ids, loss_args=(ids,))
            losses.append(float(loss))
        results.append((params, losses))
    (trained, losses), (expected, single_losses) = results
    for i in range(0, args.steps, max(1, args.steps // 5)):
        print(f"step {i:3d}  loss pipeline {losses[i]:.5f}  one program {single_losses[i]:.5f}")
    difference = max(float(np.abs(np.asarray(trained[k]) - np.asarray(expected[k])).max()) for k in expected)
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}; max |parameter difference| vs one program: {difference:.2e}")
    return difference


if __name__ == "__main__":
    sys.exit(0 if main() < 1e-3 else 1)
