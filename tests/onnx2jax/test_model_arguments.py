"""The Python API takes a model the same ways everywhere: a path, bytes, a ModelProto, an onnx_ir.Model."""

from pathlib import Path

import jax
import numpy as np
import onnx
import onnx_ir
import pytest

import onnx2jax
import sharding
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tp") / "llama_tp2.onnx"
    onnx.save(megatron_plan(onnx.load(LLAMA), 2), path)
    return path


def test_check_and_infer_take_a_path_like_a_proto(annotated):
    proto = onnx.load(annotated)
    assert sharding.check(str(annotated)) == sharding.check(proto)
    assert sharding.check(annotated) == sharding.check(proto)  # a pathlib.Path too
    by_path, by_proto = sharding.infer(str(annotated)), sharding.infer(proto)
    assert by_path.tensors == by_proto.tensors and by_path.tensors


def test_an_onnx_ir_model_is_accepted_wherever_a_proto_is(annotated):
    inputs = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    expected = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]  # onnxruntime's outputs
    (logits,) = onnx2jax.translate(onnx_ir.load(str(LLAMA)))(inputs)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4)
    (sharded,) = onnx2jax.compile(onnx_ir.load(str(annotated)))(inputs)
    np.testing.assert_allclose(np.asarray(sharded), expected, atol=1e-4)
    proto = onnx.load(annotated)
    assert sharding.check(onnx_ir.load(str(annotated))) == sharding.check(proto)
    assert sharding.infer(onnx_ir.load(str(annotated))).tensors == sharding.infer(proto).tensors


def test_something_else_is_a_type_error():
    with pytest.raises(TypeError, match="onnx_ir.Model"):
        onnx2jax.translate(42)
    with pytest.raises(TypeError, match="onnx_ir.Model"):
        sharding.check(42)


def test_jit_of_fn_without_x64_is_a_precision_error():
    model = onnx2jax.translate(LLAMA)
    assert not jax.config.jax_enable_x64
    with pytest.raises(onnx2jax.PrecisionError, match="enable_x64"):
        jax.jit(model.fn)(model.params, np.zeros((1, 4), np.int64))
    with jax.enable_x64(True):  # the documented way works, and equals the model's own call
        (traced,) = jax.jit(model.fn)(model.params, np.zeros((1, 4), np.int64))
    (called,) = model(np.zeros((1, 4), np.int64))
    np.testing.assert_allclose(np.asarray(traced), np.asarray(called), atol=1e-6)
