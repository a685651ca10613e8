"""Torch autograd gradients of a fixed scalar loss of tiny_llama, beside the fixture in tests/data/.

Needs the fixture venv (torch, transformers; no jax), like scripts/make_fixtures.py:

    python scripts/make_grad_fixture.py

Rebuilds the torch module that made tests/data/tiny_llama.onnx (the same builder,
``torch.manual_seed(0)``), checks that every torch parameter is one of the ONNX
initializers (exactly, or transposed: the exported Linear weights are stored as
``[in, out]`` under generated names), and writes
tests/data/tiny_llama.torch_grads.npz:

    loss_weights     float32 [2, 16, 256]: the loss is sum(logits * loss_weights)
                     on tiny_llama.inputs.npz's input_ids
    <initializer>    float32: d loss / d initializer, in the initializer's ONNX
                     name and layout (transposed back where the export transposed)

The loss and its gradients are computed by torch in float64 (the module cast
with ``.double()``) and rounded to float32 for storage.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from make_fixtures import DATA, Wrapper, build_llama, save_npz

SEED = 0


def initializer_of(value: np.ndarray, initializers: dict[str, np.ndarray]) -> tuple[str, bool]:
    """The name of the one ONNX initializer holding ``value`` and whether it holds it transposed."""
    found = [
        (name, transposed)
        for name, init in initializers.items()
        for transposed in (False, True)
        if init.dtype == value.dtype
        and (value.T if transposed else value).shape == init.shape
        and np.array_equal(value.T if transposed else value, init)
        and (value.ndim == 2 or not transposed)
    ]
    assert len(found) == 1, found
    return found[0]


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    spec = build_llama()
    proto = onnx.load(os.path.join(DATA, "tiny_llama.onnx"))
    initializers = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    ids = torch.from_numpy(np.load(os.path.join(DATA, "tiny_llama.inputs.npz"))["input_ids"])

    model = spec["model"]
    names = {name: initializer_of(p.detach().numpy(), initializers) for name, p in model.named_parameters()}
    wrapper = Wrapper(model, spec["kwargs"], spec["out_attrs"]).double().eval()
    (logits,) = wrapper(input_ids=ids)
    weights = np.random.default_rng(SEED).normal(size=tuple(logits.shape)).astype(np.float32)
    loss = (logits * torch.from_numpy(weights).double()).sum()
    params = dict(model.named_parameters())
    grads = torch.autograd.grad(loss, list(params.values()))
    arrays = {"loss_weights": weights}
    for (name, _), grad in zip(params.items(), grads):
        onnx_name, transposed = names[name]
        grad = grad.detach().numpy()
        arrays[onnx_name] = (grad.T if transposed else grad).astype(np.float32)
        print(f"{name:55s} -> {onnx_name}{' (transposed)' if transposed else ''}")
    path = os.path.join(DATA, "tiny_llama.torch_grads.npz")
    save_npz(path, arrays)
    print(f"loss = {loss.item():.6f}; wrote {path}")


if __name__ == "__main__":
    main()
