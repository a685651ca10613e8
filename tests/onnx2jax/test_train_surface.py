"""The training surface names what is wrong: ``apply``'s and ``to_onnx``'s parameters, and token ids under ``apply``.

On the tiny Llama under the Megatron plan (8 devices). References: onnxruntime's stored logits for
the fixture's ids, and onnxruntime refusing what ``to_onnx`` would otherwise have written.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.errors import InputRangeError, ParameterError
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def compiled():
    return onnx2jax.compile(megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8))


@pytest.fixture(scope="module")
def ids():
    return np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]


def test_apply_names_an_unknown_parameter(compiled, ids):
    name = compiled.trainable[0]
    with pytest.raises(ParameterError, match=rf"'{name}x' is not a parameter of this model \(did you mean '{name}'") as caught:
        compiled.apply({f"{name}x": compiled.params[name]}, ids)
    assert isinstance(caught.value, KeyError) and str(caught.value).startswith("apply: ")  # one error class, unquoted


def test_apply_names_a_wrong_shaped_parameter_with_both_shapes(compiled, ids):
    name = next(k for k in compiled.trainable if compiled.params[k].ndim == 2)
    want = list(compiled.params[name].shape)
    wrong = np.zeros((want[0] + 1, want[1]), np.float32)
    with pytest.raises(ParameterError, match=rf"parameter '{name}' has shape \[{want[0] + 1}, {want[1]}\], expected \[{want[0]}, {want[1]}\]"):
        compiled.apply({name: wrong}, ids)


def test_apply_with_the_trainable_subset_takes_the_rest_from_the_executable(compiled, ids):
    expected = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]
    trainable = {k: compiled.params[k] for k in compiled.trainable}
    assert set(trainable) != set(compiled.params)  # some parameters are not trainable (the 'zeros')
    with jax.enable_x64(True):
        # jitted: run op by op on 8 devices, this forward and backward took ~16 s of the default suite
        (logits,) = jax.jit(compiled.apply)(trainable, ids)
        grads = jax.jit(jax.grad(lambda p: compiled.apply(p, ids)[0].astype(np.float32).sum()))(trainable)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-4)
    assert set(grads) == set(trainable)


def test_apply_checks_token_ids_as_a_call_does(compiled, ids):
    bad = ids.copy()
    bad[1, 3] = 256  # the vocabulary has 256 rows
    with pytest.raises(InputRangeError, match=r"input 'input_ids' at \[1, 3\] is 256, outside \[-256, 256\)"):
        compiled(bad)
    with pytest.raises(InputRangeError, match=r"input 'input_ids' at \[1, 3\] is 256"), jax.enable_x64(True):
        compiled.apply(compiled.params, bad)


def test_checked_apply_refuses_out_of_range_ids_under_jit(compiled, ids):
    from jax.experimental import checkify

    bad = ids.copy()
    bad[0, 0] = -300
    with jax.enable_x64(True):
        step = jax.jit(compiled.checked_apply)
        error, (logits,) = step(compiled.params, ids)
        error.throw()  # in range: nothing raised
        np.testing.assert_allclose(np.asarray(logits), np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"], atol=1e-4)
        error, _ = step(compiled.params, bad)
    with pytest.raises(checkify.JaxRuntimeError, match=r"input 'input_ids' holds a value outside \[-256, 256\)"):
        error.throw()


def test_to_onnx_refuses_a_weight_of_another_shape_or_dtype(compiled, tmp_path):
    import onnxruntime as ort

    name = next(k for k in compiled.trainable if compiled.params[k].ndim == 2)
    shape = compiled.params[name].shape
    wrong = np.zeros((shape[0], shape[1] + 1), np.float32)
    with pytest.raises(ParameterError, match=rf"parameter '{name}' is float32 \[{shape[0]}, {shape[1] + 1}\], expected float32"):
        compiled.to_onnx({name: wrong}, tmp_path / "wrong.onnx")
    assert not (tmp_path / "wrong.onnx").exists()
    with pytest.raises(ParameterError, match=rf"parameter '{name}' is float16"):
        compiled.to_onnx({name: np.zeros(shape, np.float16)})
    # what the refusal spares the user: onnxruntime rejects the written model (the check is not ours alone)
    model = onnx.load(DATA / "tiny_llama.onnx")
    tensor = next(t for t in model.graph.initializer if t.name == name)
    tensor.CopyFrom(onnx.numpy_helper.from_array(np.zeros((tensor.dims[0], tensor.dims[1] + 1), np.float32), name))
    with pytest.raises(Exception, match="(?i)dimension|shape"):
        session = ort.InferenceSession(model.SerializeToString())
        session.run(None, {"input_ids": np.zeros((1, 4), np.int64)})
