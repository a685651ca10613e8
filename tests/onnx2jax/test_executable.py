"""One executable interface (issue 19): every way of running is an ``Executable`` with a pure ``apply``.

References: the unsharded ``JaxModel`` run and gradients of the same model
(``onnx2jax.translate``), onnxruntime's stored logits, and each executable's
own ``__call__`` only where the thing under test is that ``apply`` runs the
same program.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.runtime.executable import Executable
from onnx2jax.runtime.pipeline import PipelineCompiled
from onnx2jax.runtime.schedule import GPipe
from onnx2jax.runtime.segmented import SegmentedCompiled
from onnx2jax.runtime.spmd import Compiled
from sharding.annotate import add_configuration, set_stage
from sharding.megatron.plan import megatron_plan
from sharding.stages import auto_stages
from test_segments_sharded import nonzero_then_matmul

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]


@pytest.fixture(scope="module")
def megatron() -> Compiled:
    return onnx2jax.compile(megatron_plan(onnx.load(LLAMA), 8), scan_layers=False)


def _pipeline(stages: int = 2) -> onnx.ModelProto:
    model = onnx.load(LLAMA)
    stage_of, _ = auto_stages(model, stages)
    add_configuration(model, "pp", stages)
    for node, stage in stage_of.items():
        set_stage(model, node, stage, "pp")
    return model


def test_every_way_of_running_is_an_executable(megatron) -> None:
    pipeline = onnx2jax.compile(_pipeline(), microbatches=2)
    segmented = onnx2jax.compile(nonzero_then_matmul())
    assert (type(megatron), type(pipeline), type(segmented)) == (Compiled, PipelineCompiled, SegmentedCompiled)
    for executable in (megatron, pipeline, segmented):
        assert isinstance(executable, Executable)


def test_jitted_apply_equals_the_unsharded_run(megatron, ids) -> None:
    reference = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]
    (unsharded,) = onnx2jax.translate(str(LLAMA), scan_layers=False)(ids)
    with jax.enable_x64(True):
        (logits,) = jax.jit(megatron.apply)(megatron.params, ids)
    assert logits.sharding.mesh.shape == megatron.mesh.shape
    np.testing.assert_allclose(np.asarray(logits), np.asarray(unsharded), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)
    (called,) = megatron(ids)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(called), rtol=1e-6, atol=1e-6)


def test_grad_of_apply_equals_the_unsharded_gradient(megatron, ids) -> None:
    model = onnx2jax.translate(str(LLAMA), scan_layers=False)
    floats = [n for n, v in megatron.params.items() if jnp.issubdtype(v.dtype, jnp.floating)]
    same_shape = [n for n in floats if megatron.params[n].shape == model.params[n].shape]
    assert len(same_shape) == len(floats) > 10  # tiny Llama's Megatron plan stores every weight in its ONNX shape
    weights = np.random.default_rng(0).normal(size=np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"].shape)

    def sharded_loss(params):
        (logits,) = megatron.apply({**megatron.params, **params}, ids)
        return jnp.sum(logits * weights)

    def unsharded_loss(params):
        (logits,) = model.fn({**model.params, **params}, ids)
        return jnp.sum(logits * weights)

    with jax.enable_x64(True):
        grads = jax.jit(jax.grad(sharded_loss))({n: megatron.params[n] for n in floats})
        expected = jax.jit(jax.grad(unsharded_loss))({n: jnp.asarray(model.params[n]) for n in floats})
    for name in floats:
        assert grads[name].sharding.is_equivalent_to(megatron.params[name].sharding, grads[name].ndim), name
        scale = float(np.abs(expected[name]).max())  # float32 sums: a gradient near 0 differs by rounding alone
        np.testing.assert_allclose(np.asarray(grads[name]), np.asarray(expected[name]), atol=max(1e-4 * scale, 1e-5), err_msg=name)


def test_pipeline_apply_runs_the_stages_and_equals_the_unsharded_run(ids) -> None:
    compiled = onnx2jax.compile(_pipeline(), microbatches=2)
    (unsharded,) = onnx2jax.translate(str(LLAMA))(ids)
    with jax.enable_x64(True):
        (logits,) = compiled.apply(compiled.params, ids)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(unsharded), rtol=1e-5, atol=1e-5)
    lowered = compiled.lower(ids)
    assert len(lowered) == 2 and all(isinstance(x, jax.stages.Lowered) for x in lowered)


class _Recording:
    """Every stage of micro-batch 0, then of micro-batch 1, ...: a valid order that is not GPipe's."""

    def __init__(self) -> None:
        self.issued: list[tuple[int, int]] = []

    def steps(self, stages: int, microbatches: int):
        for microbatch in range(microbatches):
            for stage in range(stages):
                self.issued.append((stage, microbatch))
                yield stage, microbatch


def test_a_custom_schedule_is_honoured(ids) -> None:
    compiled = onnx2jax.compile(_pipeline(), microbatches=2)
    assert isinstance(compiled.schedule, GPipe)
    assert list(GPipe().steps(2, 2)) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    (expected,) = compiled(ids)
    compiled.schedule = _Recording()
    (logits,) = compiled(ids)
    assert compiled.schedule.issued == [(0, 0), (1, 0), (0, 1), (1, 1)]
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=1e-6, atol=1e-6)

    class Backwards:
        def steps(self, stages, microbatches):
            return iter([(1, 0), (0, 0), (1, 1), (0, 1)])

    compiled.schedule = Backwards()
    with pytest.raises(ValueError, match="stage 1 of micro-batch 0 before stage 0"):
        compiled(ids)


def test_segmented_apply_equals_the_unsharded_run() -> None:
    compiled = onnx2jax.compile(nonzero_then_matmul())
    x = np.random.default_rng(3).normal(size=(6, 16)).astype(np.float32)
    (expected,) = onnx2jax.translate(nonzero_then_matmul())(x)
    (y,) = compiled.apply(compiled.params, x)
    np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-5)
    lowered = compiled.lower(x)
    assert [x is None for x in lowered] == [s.kind == "host" for s in compiled.segments]
