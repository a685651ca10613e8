"""An ONNX model as a flax NNX module (``onnx2jax.nnx``), trained under TP 8 with nnx.jit and nnx.Optimizer.

Reference: the same optax steps on one device through the plain translated
function (``onnx2jax.translate(...).fn``, no mesh, no nnx).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from flax import nnx
from train_helpers import next_token_loss, train_steps
from zoo_cases import ZOO

import onnx2jax
from onnx2jax.nnx import Constant, OnnxModule, from_onnx
from sharding.megatron import megatron_plan

LLAMA = ZOO.parent / "tiny_llama.onnx"
STEPS = 3


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.load(ZOO.parent / "tiny_llama.inputs.npz")["input_ids"]


def test_trainable_initializers_are_params_carrying_their_sharding(ids) -> None:
    module = from_onnx(megatron_plan(onnx.load(LLAMA), 8), scan_layers=False)
    assert isinstance(module, OnnxModule)
    compiled = module.compiled
    params = nnx.state(module, nnx.Param)["params"]
    constants = nnx.state(module, Constant)["params"]
    assert set(params) == set(compiled.trainable) and "model.model.rotary_emb.inv_freq" in constants
    assert set(params) | set(constants) == set(compiled.params)
    specs = {name: spec.get_value() for name, spec in nnx.get_partition_spec(params).items()}
    for name in params:
        placed = compiled.params[name]
        metadata = jax.sharding.NamedSharding(compiled.mesh, specs[name])
        assert metadata.is_equivalent_to(placed.sharding, placed.ndim), name
        assert params[name][...].sharding.is_equivalent_to(placed.sharding, placed.ndim), name
    assert any(spec != jax.sharding.PartitionSpec() for spec in specs.values())
    (logits,) = module(ids)
    reference = np.load(ZOO.parent / "tiny_llama.ort_outputs.npz")["logits"]
    np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)


def test_nnx_optimizer_steps_under_tp_equal_optax_on_one_device(ids, tmp_path) -> None:
    module = from_onnx(megatron_plan(onnx.load(LLAMA), 8), scan_layers=False)
    optimizer = nnx.Optimizer(module, optax.adam(1e-2), wrt=nnx.Param)

    def loss_fn(model):
        (logits,) = model(ids)
        return next_token_loss(logits, ids)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(module, optimizer)) for _ in range(STEPS)]

    names = module.compiled.trainable
    model = onnx2jax.translate(str(LLAMA), scan_layers=False)
    single = ({k: jnp.asarray(v) for k, v in model.params.items() if k in names},
              {k: v for k, v in model.params.items() if k not in names})
    expected, _, expected_losses = train_steps(model.fn, single, ids, optax.adam(1e-2), STEPS)
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    values = module.values()
    for name in names:  # Adam moves each weight by up to lr = 1e-2 a step whatever the gradient's size, so
        # where a gradient is ~1e-8 (its epsilon) float32 summation order alone moves the update: 1% of a step
        np.testing.assert_allclose(np.asarray(values[name]), np.asarray(expected[name]), atol=1e-4, err_msg=name)
        assert values[name].sharding.is_equivalent_to(module.compiled.params[name].sharding, values[name].ndim)
    moments = 0
    for path, leaf in nnx.to_flat_state(nnx.state(optimizer, nnx.OptState)):
        if path[-1] in names:  # Adam's mu and nu, per parameter
            moments += 1
            param = module.compiled.params[path[-1]]
            assert leaf[...].sharding.is_equivalent_to(param.sharding, param.ndim), path
    assert moments == 2 * len(names)
    written = module.to_onnx(tmp_path / "trained.onnx")
    assert {t.name for t in written.graph.initializer} >= set(names)
