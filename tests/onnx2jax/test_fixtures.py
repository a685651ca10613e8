"""The torch-exported transformer fixtures against onnxruntime."""

import pathlib

import numpy as np
import onnxruntime as ort
import pytest

import onnx2jax

DATA = pathlib.Path(__file__).parents[1] / "data"
FIXTURES = ["tiny_llama", "tiny_gpt2", "tiny_bert"]


@pytest.fixture(scope="module", params=FIXTURES)
def fixture(request):
    name = request.param
    return name, onnx2jax.translate(DATA / f"{name}.onnx")


def test_matches_stored_onnxruntime_outputs(fixture):
    name, model = fixture
    inputs = dict(np.load(DATA / f"{name}.inputs.npz"))
    reference = np.load(DATA / f"{name}.ort_outputs.npz")
    outputs = model(**inputs)
    for output_name, value in zip(model.output_names, outputs):
        expected = reference[output_name]
        assert value.dtype == expected.dtype
        np.testing.assert_allclose(np.asarray(value), expected, rtol=1e-5, atol=1e-5)


def test_other_shape_matches_live_onnxruntime(fixture):
    """batch and seq are symbolic: a second shape signature retraces and still matches."""
    name, model = fixture
    rng = np.random.default_rng(7)
    inputs = {"input_ids": rng.integers(0, 256, (3, 7)).astype(np.int64)}
    if "attention_mask" in model.input_names:
        inputs["attention_mask"] = np.ones((3, 7), np.int64)
    session = ort.InferenceSession(str(DATA / f"{name}.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    for value, reference in zip(model(**inputs), expected):
        np.testing.assert_allclose(np.asarray(value), reference, rtol=1e-5, atol=1e-5)
