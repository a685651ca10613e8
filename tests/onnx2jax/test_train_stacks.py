"""Per-device stacks (`onnx2jax.runtime.stacks`): the backward's reductions at the minimum, values unchanged.

Two minimal graphs (`minimal_graphs.parallel_residual`, GPT-NeoX's block
shape; `minimal_graphs.gemm_gate_up`, a gated MLP of transB Gemms) compiled
on 8 fake devices. Outputs against onnxruntime; gradients of a fixed loss
(tanh of the output, so that the forward's values are needed) against the same model written in jax.numpy from its initializers on
one device; the all-reduce operands of the compiled forward and of
``jit(grad(loss))`` against the analytic minimum, and against what the same
program costs with the stacks turned off (every product as XLA partitions
it), so that the count is seen to come from the stacks.
"""

from __future__ import annotations

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from minimal_graphs import gemm_gate_up, parallel_residual
from onnx import numpy_helper

import onnx2jax
from onnx2jax.runtime.constraints import ShardingHooks

BLOCKS = 2


def _operands(text: str) -> int:
    """All-reduce operands in compiled HLO (XLA's combiner puts independent ones in one tuple all-reduce)."""
    return sum(m.count("%") for m in re.findall(r"=\s*[^=\n]*?\ball-reduce(?:-start)?\(([^)]*)\)", text))


@contextlib.contextmanager
def _plain(monkeypatch, on: bool):
    if on:
        with monkeypatch.context() as patch:
            patch.setattr(ShardingHooks, "_column_parallel", lambda self, *args: None)
            patch.setattr(ShardingHooks, "_add_partials", lambda self, *args: None)
            yield
    else:
        yield


def _layer_norm(x, g, b):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * g + b


def _parallel_residual(p, x):
    for k in range(BLOCKS):
        out = x
        for side in "ab":
            s = f"{side}{k}"
            h = jax.nn.relu(_layer_norm(x, p[f"g_{s}"], p[f"b_{s}"]) @ p[f"w_{s}_up"])
            out = out + h @ p[f"w_{s}_down"] + p[f"bias_{s}"]
        x = out
    return x


def _gate_up(p, x):
    x = x * p["scale"]
    gate = x @ p["w_gate"].T
    return (jax.nn.silu(gate) * (x @ p["w_up"].T)) @ p["w_down"].T


CASES = {
    "parallel_residual": (lambda: parallel_residual(BLOCKS), _parallel_residual, (2, 16, 16), (BLOCKS, 2 * BLOCKS)),
    "gemm_gate_up": (gemm_gate_up, _gate_up, (12, 16), (1, 2)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_stacks_reach_the_minimum_with_unchanged_values(name, monkeypatch):
    build, reference, shape, minimum = CASES[name]
    model = build()
    x = np.random.default_rng(3).normal(size=shape).astype(np.float32)
    weights = np.random.default_rng(4).normal(size=shape).astype(np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    counts = {}
    for plain in (False, True):
        with _plain(monkeypatch, plain):
            compiled = onnx2jax.compile(model)
            params = {k: compiled.params[k] for k in compiled.trainable}

            def forward(p):
                return compiled.apply({**compiled.params, **p}, x)[0]

            def loss(p):
                return jnp.sum(jnp.tanh(forward(p)) * weights)

            fwd = jax.jit(forward).lower(params).compile()
            grad = jax.jit(jax.grad(loss)).lower(params).compile()
            np.testing.assert_allclose(np.asarray(fwd(params)), expected, rtol=1e-4, atol=1e-4)
            counts[plain] = (_operands(fwd.as_text()), _operands(grad.as_text()))
            if plain:
                continue
            grads = grad(params)
            initial = {t.name: jnp.asarray(numpy_helper.to_array(t)) for t in model.graph.initializer}
            want = jax.grad(lambda p: jnp.sum(jnp.tanh(reference(p, jnp.asarray(x))) * weights))(initial)
            for key, value in grads.items():
                assert value.sharding.is_equivalent_to(compiled.params[key].sharding, value.ndim), key
                logical = np.asarray(compiled._logical_params({key: value})[key])
                scale = float(np.abs(want[key]).max())
                np.testing.assert_allclose(logical, np.asarray(want[key]), atol=1e-4 * scale + 1e-6, err_msg=key)
    assert counts[False] == minimum
    assert counts[True][1] > counts[False][1]  # XLA alone reduces each product's input gradient separately
