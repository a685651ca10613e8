"""The files onnx2jax ships for its examples: each one there, each the repository's fixture, and a clear miss."""

import filecmp
from pathlib import Path

import pytest

import onnx2jax
from onnx2jax.bundled import FILES

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = {
    "tiny_llama.onnx": "tiny_llama.onnx",
    "tiny_llama.inputs.npz": "tiny_llama.inputs.npz",
    "tiny_llama.ort_outputs.npz": "tiny_llama.ort_outputs.npz",
    "random_forest.onnx": "sklearn/random_forest.onnx",
    "random_forest.inputs.npz": "sklearn/random_forest.inputs.npz",
    "detection_head.onnx": "detection/head.onnx",
    "detection_head.inputs.npz": "detection/head.some.inputs.npz",
    "detection_head.ort_outputs.npz": "detection/head.some.ort_outputs.npz",
    "llama_gqa": "genai/llama_gqa",
    "llama_gqa_torch": "genai/llama_gqa_torch",
}


@pytest.mark.parametrize("name", FILES)
def test_each_shipped_file_is_the_fixture(name):
    shipped, fixture = onnx2jax.data_path(name), DATA / FIXTURES[name]
    if fixture.is_dir():
        files = sorted(p.name for p in fixture.iterdir())
        assert sorted(p.name for p in shipped.iterdir()) == files
        _, mismatch, errors = filecmp.cmpfiles(shipped, fixture, files, shallow=False)
        assert not mismatch and not errors
    else:
        assert filecmp.cmp(shipped, fixture, shallow=False)


def test_the_demo_model_is_the_tiny_llama():
    assert onnx2jax.demo_model_path() == onnx2jax.data_path("tiny_llama.onnx")


def test_an_unknown_name_lists_what_ships():
    with pytest.raises(FileNotFoundError, match="ships no file 'tiny_gpt2.onnx'; it ships tiny_llama.onnx, "):
        onnx2jax.data_path("tiny_gpt2.onnx")
