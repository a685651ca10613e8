"""Shared by the training tests: a scalar loss of a model's outputs, and the same loss through onnxruntime.

The loss is ``sum_k <w_k, out_k> / sqrt(size_k)`` over the floating outputs,
with fixed random ``w_k``: every output element moves it, and it stays O(1).
onnxruntime evaluates it on a written model (``Compiled.to_onnx`` with
perturbed parameters) in float64 from its float32 outputs.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnxruntime as ort
import optax
from onnx import numpy_helper
from zoo_cases import CASES, ZOO

from sharding.megatron import megatron_plan


def zoo_inputs(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(ZOO / f"{name}.inputs.npz"))


@functools.lru_cache(maxsize=None)
def zoo_model(name: str, sharded: bool) -> onnx.ModelProto:
    model = onnx.load(ZOO / f"{name}.onnx")
    return megatron_plan(model, CASES[name].tp) if sharded and CASES[name].tp > 1 else model


def output_weights(name: str) -> list[np.ndarray | None]:
    """The loss's fixed weight per output of a zoo model (None: not a floating output)."""
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    rng = np.random.default_rng(7)
    weights = []
    for key in reference.files:
        value = reference[key]
        weights.append(rng.normal(size=value.shape) / np.sqrt(value.size) if value.dtype.kind == "f" else None)
    return weights


def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: float32 initializers, constants, casts, inputs and outputs widened.

    onnxruntime has float64 kernels for the LMs' ops (MatMul, Softmax, Pow,
    ...) but not for Erf or Conv: those models stay float32.
    """
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph

    def widen(tensor: onnx.TensorProto) -> None:
        if tensor.data_type == onnx.TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name))

    for tensor in graph.initializer:
        widen(tensor)
    for info in list(graph.input) + list(graph.output) + list(graph.value_info):
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            info.type.tensor_type.elem_type = onnx.TensorProto.DOUBLE
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Cast" and attribute.name == "to" and attribute.i == onnx.TensorProto.FLOAT:
                attribute.i = onnx.TensorProto.DOUBLE
            if attribute.type == onnx.AttributeProto.TENSOR:
                widen(attribute.t)
    return wide


def jax_loss(outputs, weights) -> jnp.ndarray:
    """The loss in the outputs' own precision (float32, or float64 for a widened model)."""
    return sum(jnp.sum(out * w.astype(out.dtype)) for out, w in zip(outputs, weights) if w is not None)


def ort_session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def ort_outputs(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort_session(model)
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in inputs.items() if k in names})


def ort_loss(model: onnx.ModelProto, inputs: dict[str, np.ndarray], weights) -> float:
    outputs = ort_outputs(model, inputs)
    return float(sum(np.sum(o.astype(np.float64) * w) for o, w in zip(outputs, weights) if w is not None))


def next_token_loss(logits: jax.Array, ids: np.ndarray) -> jax.Array:
    """Mean cross entropy of each position's logits against the next token."""
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1].astype(jnp.float32), ids[:, 1:]).mean()


def train_steps(apply, params, ids, optimizer, steps: int):
    """``steps`` optax steps of :func:`next_token_loss` on ``apply(params, ids)``; params = (trained, frozen).

    Returns the trained parameters, the optimizer state and each step's loss.
    """
    def loss(trained, state_params):
        (logits,) = apply({**state_params, **trained}, ids)
        return next_token_loss(logits, ids)

    @jax.jit
    def step(trained, state, frozen):
        value, grads = jax.value_and_grad(loss)(trained, frozen)
        updates, state = optimizer.update(grads, state, trained)
        return optax.apply_updates(trained, updates), state, value

    trained, frozen = params
    state = optimizer.init(trained)
    losses = []
    with jax.enable_x64(True):
        for _ in range(steps):
            trained, state, value = step(trained, state, frozen)
            losses.append(float(value))
    return trained, state, losses
