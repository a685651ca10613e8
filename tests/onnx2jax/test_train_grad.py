"""Gradients through ``Compiled.apply`` against onnxruntime's central finite differences (issue 22).

For every trainable parameter of a zoo model (LMs, encoders, CNNs), the
directional derivative of a scalar loss of the outputs along a random
direction in that parameter (and along one joint direction in all of them)
equals ``(L(p + e d) - L(p - e d)) / 2e`` where onnxruntime computes ``L`` on
the model written back with the perturbed weights (``Compiled.to_onnx``).

In float64 where onnxruntime can (the LMs: ``train_helpers.to_float64``
widens the model, which is then compiled and differentiated in float64): the
quotient at e = 1e-5 is exact to ~1e-10 and no ReLU kink or expert switch
lies that close, so ``|g.d - fd| <= 1e-8 + 1e-5 |fd|``. Float32 alone was not
enough there: T5's float32 loss is a different function from its float64 one
at the 1e-2 level (its relative-position buckets and large activations), so
its float32 quotients wander with the step (0.052, 0.062, 0.052, 0.045 at e =
1e-2 ... 3e-4 on the decoder's first layer norm) while the float64 ones settle
at jax's float64 gradient, 0.0562303, to 8 digits.

In float32 (onnxruntime has no float64 Erf or Conv: gpt_neox, roberta, vit,
wav2vec2, resnet, convnext): each weight moves by e = 1e-2 of its RMS, the
loss is O(1) and summed in float64 from float32 outputs, so rounding moves the
quotient by ~1e-6 / 2e at most and the O(e^2) truncation is relatively ~1e-4:
``|g.d - fd| <= 5e-7 / e + 1e-3 |fd|`` (measured: at most ~1e-5 absolute).
resnet (ReLU, MaxPool) is piecewise linear: a step of 1e-2 crosses kinks, and
the quotient converges to the gradient only as e shrinks (0.1735, 0.1639,
0.1620 at e = 1e-2, 1e-3, 3e-4 for a gradient of 0.1609 on its stem), so there
e = 2e-4 and the relative part is 1e-2 (the kinks crossed are O(e)).

Sharded (Megatron plan, 8 fake devices, float32): the gradients equal the
unsharded ones and come back with their parameter's sharding.
"""

from __future__ import annotations

import functools
import re

import jax
import numpy as np
import onnx
import pytest
from train_helpers import jax_loss, ort_loss, output_weights, to_float64, zoo_inputs, zoo_model
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.runtime.report import count_collectives
from sharding.megatron import megatron_plan

FLOAT64 = ("mistral", "qwen2", "gpt2", "phi3", "gpt_bigcode", "qwen2_moe", "t5")
WIDE = (1e-5, 1e-8, 1e-5)  # (step, absolute, relative tolerance) in float64
SMOOTH = (1e-2, 5e-7 / 1e-2, 1e-3)
KINKED = {"resnet": (2e-4, 5e-7 / 2e-4, 1e-2)}
CASES_DATA = ZOO.parent
FAST = ("mistral", "roberta", "resnet")


def _params(names):
    return [pytest.param(n, marks=[] if n in FAST else [pytest.mark.slow]) for n in names]


@functools.lru_cache(maxsize=None)
def _compiled(name: str, sharded: bool, wide: bool = False):
    model = zoo_model(name, sharded)
    if not wide:
        return onnx2jax.compile(model)
    with jax.enable_x64(True):  # float64 parameters are placed as float64 only with x64 on
        return onnx2jax.compile(to_float64(model))


def _grads(compiled, name: str):
    inputs, weights = zoo_inputs(name), output_weights(name)

    def loss(params):
        return jax_loss(compiled.apply({**compiled.params, **params}, **inputs), weights)

    with jax.enable_x64(True):
        return jax.jit(jax.grad(loss))({k: compiled.params[k] for k in compiled.trainable})


def _direction(rng, value) -> np.ndarray:
    value = np.asarray(value)
    scale = max(float(np.sqrt(np.mean(value.astype(np.float64) ** 2))), 0.02)
    return (rng.normal(size=value.shape) * scale).astype(value.dtype)


def _finite_difference(compiled, name: str, step: dict[str, np.ndarray], eps: float) -> float:
    inputs, weights = zoo_inputs(name), output_weights(name)
    plus = {k: np.asarray(compiled.params[k]) + eps * d for k, d in step.items()}
    minus = {k: np.asarray(compiled.params[k]) - eps * d for k, d in step.items()}
    higher, lower = ort_loss(compiled.to_onnx(plus), inputs, weights), ort_loss(compiled.to_onnx(minus), inputs, weights)
    return (higher - lower) / (2 * eps)


@pytest.mark.parametrize("name", _params(list(CASES)))
def test_gradients_equal_onnxruntime_finite_differences(name):
    wide = name in FLOAT64
    compiled = _compiled(name, False, wide)
    grads = _grads(compiled, name)
    assert set(grads) == set(compiled.trainable) and grads
    assert all(g.dtype == (np.float64 if wide else np.float32) for g in grads.values())
    eps, atol, rtol = WIDE if wide else KINKED.get(name, SMOOTH)
    rng = np.random.default_rng(1)
    joint = {}
    for key in compiled.trainable:
        direction = joint[key] = _direction(rng, compiled.params[key])
        analytic = float(np.sum(np.asarray(grads[key], np.float64) * direction))
        numeric = _finite_difference(compiled, name, {key: direction}, eps)
        assert abs(analytic - numeric) <= atol + rtol * abs(numeric), (key, analytic, numeric)
    analytic = sum(float(np.sum(np.asarray(grads[k], np.float64) * d)) for k, d in joint.items())
    numeric = _finite_difference(compiled, name, joint, eps)
    assert abs(analytic - numeric) <= atol + rtol * abs(numeric), (analytic, numeric)


@pytest.mark.parametrize("name", _params([n for n, c in CASES.items() if c.tp > 1]))
def test_sharded_gradients_equal_unsharded_and_keep_their_sharding(name):
    sharded, plain = _compiled(name, True), _compiled(name, False)
    assert set(sharded.trainable) == set(plain.trainable)
    grads, expected = _grads(sharded, name), _grads(plain, name)
    assert any(not g.sharding.is_fully_replicated for g in grads.values())
    for key, grad in grads.items():
        assert grad.sharding.is_equivalent_to(sharded.params[key].sharding, grad.ndim), key
        logical = np.asarray(sharded._logical_params({key: grad})[key])
        scale = float(np.abs(expected[key]).max())
        np.testing.assert_allclose(logical, np.asarray(expected[key]), atol=max(1e-4 * scale, 1e-6), err_msg=key)


def _all_reduce_operands(text: str) -> int:
    """All-reduce operands in compiled HLO (XLA's combiner puts independent ones in one tuple all-reduce)."""
    return sum(m.count("%") for m in re.findall(r"=\s*[^=\n]*?\ball-reduce(?:-start)?\(([^)]*)\)", text))


def _backward_collectives(compiled, loss, params) -> tuple[dict[str, int], int, str]:
    with jax.enable_x64(True):
        text = jax.jit(jax.grad(loss)).lower(params).compile().as_text()
    return {k: v for k, v in count_collectives(text).items() if v}, _all_reduce_operands(text), text


#: Per zoo model under the Megatron plan on 8 devices: (collective instructions, all-reduce operands) of
#: jit(grad(loss)). The minimum all-reduce operands: the forward's (one per row-parallel product and
#: vocabulary-split embedding) plus, in the backward, one per column-parallel input (the block's input
#: read by q|k|v once, the MLP's up, a vocabulary-split LM head).
BACKWARD = {
    "roberta": ({"all-reduce": 9}, 9),  # 5 + 2 blocks x (q|k|v, up): the minimum
    "vit": ({"all-reduce": 8}, 8),  # 4 + 2 x 2: the minimum
    "mistral": ({"all-reduce": 9, "all-gather": 4}, 10),  # 5 + 2 x 2 + LM head: the minimum, and GQA's gathers
    "qwen2": ({"all-reduce": 9, "all-gather": 4}, 10),  # as mistral
    "gpt2": ({"all-reduce": 9}, 10),  # 5 + 2 x 2 + the tied LM head: the minimum
    "wav2vec2": ({"all-reduce": 8}, 8),  # 4 + 2 x 2: the minimum
    "whisper_encoder": ({"all-reduce": 8}, 8),  # 4 + 2 x 2: the minimum
    "convnext": ({"all-reduce": 4}, 4),  # 2 + 2 x 1: the minimum
    "t5": ({"all-reduce": 21, "all-gather": 2}, 24),  # the minimum of all-reduce operands (README)
    # Parallel residual x + attn(ln1(x)) + mlp(ln2(x)): forward 2 blocks x 1 (the attention's and the MLP's
    # partial sums added before one all-reduce) + embedding = 3; backward 2 x 1 (x's stack feeds both
    # LayerNorms, so q|k|v's and up's partial gradients, and the LayerNorms' scale and bias gradients
    # stacked with x, sum locally and reduce once) + the LM head: 6, the minimum.
    "gpt_neox": ({"all-reduce": 5}, 6),
    # 5 + 2 x (q|k|v, the shared expert's gate|up: Gemms reading one stack) + LM head: the minimum. The router
    # and the routed experts stay replicated (no collective); the gathers are GQA's, as mistral.
    "qwen2_moe": ({"all-reduce": 9, "all-gather": 4}, 10),
    # Below the formula's 10 because the plan keeps the fused q|k|v projection (64 -> 64 + 32 + 32) replicated:
    # no column-parallel input in attention, so 5 + 2 x (gate|up) + LM head = 8, the minimum for this plan.
    # The cost is in the gathers: per block the query's cotangent (head-split after the replicated
    # projection) and GQA's K/V as mistral: 3 x 2.
    "phi3": ({"all-reduce": 7, "all-gather": 6}, 8),
    # As phi3: the fused multi-query c_attn (64 -> 64 + 8 + 8) is replicated by the plan; 5 + 2 x up + the
    # tied LM head = 8, and per block the query cotangent's gather and two for the one K/V head's repeats.
    "gpt_bigcode": ({"all-reduce": 7, "all-gather": 6}, 8),
}


@pytest.mark.parametrize("name", _params(list(BACKWARD)))
def test_backward_collectives_of_the_zoo_tp8(name):
    """One all-reduce per column-parallel input however many products read it (q, k and v share one)."""
    compiled = _compiled(name, True)
    inputs, weights = zoo_inputs(name), output_weights(name)

    def loss(params):
        return jax_loss(compiled.apply({**compiled.params, **params}, **inputs), weights)

    counts, operands, _ = _backward_collectives(compiled, loss, {k: compiled.params[k] for k in compiled.trainable})
    assert (counts, operands) == BACKWARD[name]


def test_backward_collectives_of_tiny_llama_tp8():
    """The collectives of ``jit(grad(loss))`` on tiny Llama, TP 8, against the analytic minimum.

    Minimum (Megatron): the forward's 5 all-reduces (2 blocks x (attention
    out + MLP down) + the vocabulary-split embedding) and in the backward one
    per column-parallel input (2 blocks x (q|k|v, gate|up) + the LM head): 10
    all-reduce operands, no all-gather (the loss's own sum is not computed: the
    gradient does not need it). Measured: the 10 operands in 9 instructions
    (XLA's combiner merges independent ones into tuple all-reduces), and 4
    all-gathers: with 4 KV heads for 8 devices the plan keeps K and V
    replicated, and per block the cotangents of their repeated heads ([B, 8
    heads, S, D], one head per device) are gathered to sum each KV head's two
    copies. The layout needs one collective per K or V per block (all-reducing
    the K/V weight gradients instead would cost as many).
    """
    compiled = onnx2jax.compile(megatron_plan(onnx.load(CASES_DATA / "tiny_llama.onnx"), 8), scan_layers=False)
    ids = np.load(CASES_DATA / "tiny_llama.inputs.npz")["input_ids"]
    weights = np.random.default_rng(0).normal(size=(*ids.shape, 256)).astype(np.float32)

    def loss(params):
        (logits,) = compiled.apply({**compiled.params, **params}, ids)
        return (logits * weights).sum()

    params = {k: compiled.params[k] for k in compiled.trainable}
    counts, operands, text = _backward_collectives(compiled, loss, params)
    assert (counts, operands) == ({"all-reduce": 9, "all-gather": 4}, 10)
    gathers = [line for line in text.splitlines() if " all-gather(" in line or " all-gather-start(" in line]
    assert all("f32[2,8," in line for line in gathers)  # every gather is of the 8 heads' K/V cotangent
