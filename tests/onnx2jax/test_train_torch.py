"""Gradients through ``Compiled.apply`` against torch autograd on the module that made tiny_llama (issue 22).

``scripts/make_grad_fixture.py`` rebuilt the fixture's torch module (same seed),
matched every torch parameter to its ONNX initializer, and stored torch's
float64 gradients of ``sum(logits * loss_weights)`` (rounded to float32) in
tests/data/tiny_llama.torch_grads.npz. Torch's parameters are exactly what
``compiled.trainable`` must name (not ``inv_freq`` nor the folded constants).

Each gradient is compared within a fraction of its largest entry: unsharded
in float64 (the model widened), 1e-6 (measured ~2.5e-7: the stored float32
rounding and the fixture's float32 constants); under the Megatron plan on 8
devices in float32, 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import onnx
import pytest
from train_helpers import to_float64

import onnx2jax
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"


def _torch_grads() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    stored = dict(np.load(DATA / "tiny_llama.torch_grads.npz"))
    return stored.pop("loss_weights"), stored


@pytest.mark.parametrize("devices, wide, tolerance", [(1, True, 1e-6), (8, False, 1e-5)], ids=["float64", "tp8"])
def test_tiny_llama_gradients_equal_torch_autograd(devices, wide, tolerance):
    weights, expected = _torch_grads()
    model = onnx.load(DATA / "tiny_llama.onnx")
    if devices > 1:
        model = megatron_plan(model, devices)
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    with jax.enable_x64(True):
        compiled = onnx2jax.compile(to_float64(model) if wide else model, scan_layers=False)
        assert set(compiled.trainable) == set(expected)

        def loss(params):
            (logits,) = compiled.apply({**compiled.params, **params}, ids)
            return (logits * weights.astype(logits.dtype)).sum()

        grads = jax.jit(jax.grad(loss))({k: compiled.params[k] for k in compiled.trainable})
    for key, want in expected.items():
        got = np.asarray(compiled._logical_params({key: grads[key]})[key], np.float64)
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=0, atol=tolerance * scale, err_msg=key)
