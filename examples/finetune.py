"""Fine-tune an LM that arrived as ONNX, under tensor parallelism, and hand it back as ONNX.

    python examples/finetune.py [--steps 300] [--plot loss.png] [--out finetuned.onnx]

The zoo's Mistral (tests/data/zoo/mistral.onnx, random weights, vocabulary
256) is annotated with the Megatron plan for 8 devices, compiled for 8 fake
CPU devices, and trained with optax's Adam on a toy task: sequences that
count up from a random token (``t, t+1, t+2, ...`` modulo the vocabulary),
next-token cross entropy. Only what ``compiled.trainable`` names is trained
(the rotary ``inv_freq`` and the graph's constants are not). The loss falls
from ~ln(256); the trained weights are written back into the ONNX model
(annotations kept) and onnxruntime runs it: its logits equal the trained JAX
program's and it predicts the next count. Needs onnxruntime besides
onnx2jax (``pip install onnxruntime``), and matplotlib for ``--plot``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

import jax

jax.config.update("jax_num_cpu_devices", 8)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import optax  # noqa: E402

import onnx2jax  # noqa: E402
from sharding.megatron import megatron_plan  # noqa: E402

MODEL = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "zoo" / "mistral.onnx"


def counting(rng: np.random.Generator, batch: int, length: int, vocab: int) -> np.ndarray:
    """``batch`` sequences ``t, t+1, ...`` (mod ``vocab``) from random starts."""
    starts = rng.integers(0, vocab, size=(batch, 1))
    return (starts + np.arange(length)) % vocab


def next_token_loss(logits: jax.Array, ids: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), ids[:, 1:]).mean()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--out", type=pathlib.Path, help="where to write the fine-tuned .onnx (default: a temp dir)")
    parser.add_argument("--plot", type=pathlib.Path, metavar="LOSS.png", help="plot the loss curve (matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        try:
            import matplotlib
        except ImportError:
            parser.error("--plot needs matplotlib: pip install matplotlib")
        matplotlib.use("Agg")

    compiled = onnx2jax.compile(megatron_plan(onnx.load(MODEL), 8), scan_layers=False)
    names = compiled.trainable
    trained = {k: compiled.params[k] for k in names}
    frozen = {k: v for k, v in compiled.params.items() if k not in names}
    print(f"{len(names)} trainable parameters of {len(compiled.params)} initializers, mesh {dict(compiled.mesh.shape)}")
    with jax.enable_x64(True):
        (probe,) = compiled.apply(compiled.params, np.zeros((1, 2), np.int64))
    vocab = probe.shape[-1]

    optimizer = optax.adam(args.lr)

    def loss_fn(params, ids):
        (logits,) = compiled.apply({**frozen, **params}, ids)
        return next_token_loss(logits, ids)

    @jax.jit
    def step(params, state, ids):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    state = optimizer.init(trained)
    rng = np.random.default_rng(0)
    losses = []
    with jax.enable_x64(True):  # the model's int64 ids and shape tensors
        for i in range(args.steps):
            trained, state, loss = step(trained, state, counting(rng, args.batch, args.length, vocab))
            losses.append(float(loss))
            if i % 25 == 0 or i == args.steps - 1:
                print(f"step {i:4d}  loss {losses[-1]:.4f}")
    first, last = np.mean(losses[: max(1, len(losses) // 10)]), np.mean(losses[-max(1, len(losses) // 10):])
    print(f"loss {first:.4f} -> {last:.4f}")

    out = args.out or pathlib.Path(tempfile.mkdtemp()) / "finetuned.onnx"
    compiled.to_onnx(trained, out)
    held_out = counting(np.random.default_rng(1), 4, args.length, vocab)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (ort_logits,) = session.run(None, {"input_ids": held_out})
    with jax.enable_x64(True):
        (jax_logits,) = compiled.apply({**frozen, **trained}, held_out)
    difference = float(np.abs(ort_logits - np.asarray(jax_logits)).max())
    accuracy = float(np.mean(ort_logits[:, :-1].argmax(-1) == held_out[:, 1:]))
    print(f"wrote {out}; onnxruntime: max |logits - jax| {difference:.2e}, next-count accuracy {accuracy:.0%}")

    if args.plot:
        import matplotlib.pyplot as plt

        figure, axis = plt.subplots(figsize=(6, 3.5))
        axis.plot(losses)
        axis.set_xlabel("step")
        axis.set_ylabel("next-token cross entropy")
        axis.set_title("mistral (zoo), TP 8, Adam: counting task")
        figure.tight_layout()
        figure.savefig(args.plot)
        print(f"plotted {args.plot}")
    return 0 if last < first and difference < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
