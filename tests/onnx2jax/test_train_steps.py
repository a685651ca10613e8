"""Optimizer steps under tensor parallelism and writing the trained parameters back to ONNX (issue 22).

Reference for the steps: the same optax steps on one device through the
plain translated function (``onnx2jax.translate(...).fn``), which knows
nothing of meshes. Reference for the written model: onnxruntime.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from train_helpers import ort_outputs, train_steps
from zoo_cases import ZOO

import onnx2jax
from sharding.megatron import megatron_plan

LLAMA = ZOO.parent / "tiny_llama.onnx"


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.load(ZOO.parent / "tiny_llama.inputs.npz")["input_ids"]


@pytest.fixture(scope="module")
def tp8():
    return onnx2jax.compile(megatron_plan(onnx.load(LLAMA), 8), scan_layers=False)


# Adam's moments are sharded state that SGD lacks; SGD repeats the same sharded gradients: slow
@pytest.mark.parametrize("kind", [pytest.param("sgd", marks=pytest.mark.slow), "adam"])
def test_steps_under_tp_equal_the_steps_on_one_device(tp8, ids, kind) -> None:
    optimizer = optax.sgd(0.5) if kind == "sgd" else optax.adam(1e-2)
    names = tp8.trainable
    sharded = ({k: tp8.params[k] for k in names}, {k: v for k, v in tp8.params.items() if k not in names})
    trained, state, losses = train_steps(tp8.apply, sharded, ids, optimizer, 4)
    model = onnx2jax.translate(str(LLAMA), scan_layers=False)
    single = ({k: jnp.asarray(v) for k, v in model.params.items() if k in names},
              {k: v for k, v in model.params.items() if k not in names})
    expected, _, expected_losses = train_steps(model.fn, single, ids, optimizer, 4)
    assert losses[-1] < losses[0]
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for key in names:
        assert trained[key].sharding.is_equivalent_to(tp8.params[key].sharding, trained[key].ndim), key
        # Adam moves a weight by up to lr a step whatever its gradient's size: where a gradient is ~1e-8, the
        # float32 summation order of the sharded program moves the update; allowed: 1% of one step
        atol = 2e-5 if kind == "sgd" else 1e-4
        np.testing.assert_allclose(np.asarray(trained[key]), np.asarray(expected[key]), atol=atol, err_msg=key)
    moments = [x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, dict)) if isinstance(x, dict)]
    assert len(moments) == (2 if kind == "adam" else 0)  # Adam's mu and nu; SGD keeps none
    for key, leaf in [item for moment in moments for item in moment.items()]:
        assert leaf.sharding.is_equivalent_to(tp8.params[key].sharding, leaf.ndim), key


def test_trained_parameters_written_back_run_in_onnxruntime(tp8, ids, tmp_path) -> None:
    rng = np.random.default_rng(5)
    new = {k: tp8.params[k] + 0.05 * rng.normal(size=tp8.params[k].shape).astype(np.float32) for k in tp8.trainable}
    path = tmp_path / "trained.onnx"
    tp8.to_onnx(new, path, external_data=True)
    assert (tmp_path / "trained.onnx.data").stat().st_size > sum(np.asarray(v).nbytes for v in new.values()) // 2
    written = onnx.load(path)
    annotated = megatron_plan(onnx.load(LLAMA), 8)
    assert [n.device_configurations for n in written.graph.node] == [
        n.device_configurations for n in annotated.graph.node
    ]
    assert list(written.configuration) == list(annotated.configuration)
    (reference,) = ort_outputs(written, {"input_ids": ids})
    with jax.enable_x64(True):
        (logits,) = jax.jit(tp8.apply)({**tp8.params, **new}, ids)
    np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)
    (before,) = ort_outputs(onnx.load(LLAMA), {"input_ids": ids})
    assert np.abs(reference - before).max() > 1e-2  # the new weights are the ones onnxruntime ran


def test_scanned_layers_are_written_back_layer_by_layer(ids, tmp_path) -> None:
    compiled = onnx2jax.compile(megatron_plan(onnx.load(LLAMA), 8), scan_layers=True)
    stacked = [k for k in compiled.trainable if k.startswith("scan/")]
    assert compiled.model.scan.active and stacked  # the layers' weights train as [layers, ...] arrays
    rng = np.random.default_rng(6)
    new = {k: v + 0.05 * rng.normal(size=v.shape).astype(np.float32) for k, v in compiled.params.items()
           if k in compiled.trainable}
    written = compiled.to_onnx(new, tmp_path / "scanned.onnx")
    (reference,) = ort_outputs(written, {"input_ids": ids})
    with jax.enable_x64(True):
        (logits,) = jax.jit(compiled.apply)({**compiled.params, **new}, ids)
    np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)
