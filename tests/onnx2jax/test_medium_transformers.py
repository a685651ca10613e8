"""bench/medium_transformers.py and bench/flax_llama.py at a tiny width: onnx2jax and flax against onnxruntime.

The medium models (width 512, ~100 MB) are the same builders at a larger
config, so checking every builder at width 64 checks the graphs the benchmark
times; timings are never asserted.
"""

import pathlib
import sys

import numpy as np
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.cli.app import main

BENCH = pathlib.Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import medium_transformers as mt  # noqa: E402

SHAPES = [(2, 16), (3, 8)]


@pytest.fixture(scope="module", params=mt.KINDS)
def built(request):
    model = mt.build(request.param, mt.TINY)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return request.param, model, session


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_onnx2jax_matches_onnxruntime_on_each_medium_architecture(built, batch, seq):
    kind, model, session = built
    inputs = mt.inputs(kind, batch, seq, mt.TINY)
    expected = session.run(None, inputs)
    got = onnx2jax.translate(model)(**inputs)
    assert len(got) == len(expected) == 1
    assert got[0].shape == expected[0].shape
    np.testing.assert_allclose(np.asarray(got[0]), expected[0], rtol=1e-5, atol=2e-6)


def test_bert_padding_changes_only_what_the_mask_says():
    # The padded rows' unpadded positions must not see the padded tokens: changing a padded id leaves them alone.
    model = mt.build("bert", mt.TINY)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    inputs = mt.inputs("bert", 2, 16, mt.TINY)
    assert inputs["attention_mask"][1, -1] == 0 and inputs["attention_mask"][0].all()
    changed = {k: v.copy() for k, v in inputs.items()}
    changed["input_ids"][1, -1] = 2 + (changed["input_ids"][1, -1] - 1) % (mt.TINY.vocab - 2)
    before, after = (np.asarray(onnx2jax.translate(model)(**x)[0]) for x in (inputs, changed))
    np.testing.assert_allclose(after[1, :12], before[1, :12], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after[1, :12], session.run(None, changed)[0][1, :12], rtol=1e-5, atol=2e-6)


def test_builds_are_deterministic_from_the_seed():
    assert mt.build("llama_gqa", mt.TINY, seed=3).SerializeToString() == mt.build("llama_gqa", mt.TINY, seed=3).SerializeToString()
    assert mt.build("gpt2", mt.TINY, seed=3).SerializeToString() != mt.build("gpt2", mt.TINY, seed=4).SerializeToString()


def test_ensure_builds_once_into_the_cache_folder(tmp_path):
    path = mt.ensure("gpt2", mt.TINY, folder=tmp_path)
    stamp = path.stat().st_mtime_ns
    assert mt.ensure("gpt2", mt.TINY, folder=tmp_path) == path and path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


@pytest.mark.parametrize("batch,seq", SHAPES)
def test_flax_llama_matches_onnxruntime_with_the_exports_weights(batch, seq):
    from flax_llama import FlaxLlama, jitted

    model = mt.build("llama_gqa", mt.TINY)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    forward, state = jitted(FlaxLlama.from_onnx(model, mt.TINY))
    inputs = mt.inputs("llama_gqa", batch, seq, mt.TINY)
    np.testing.assert_allclose(np.asarray(forward(state, inputs["input_ids"])), session.run(None, inputs)[0],
                               rtol=1e-5, atol=2e-6)


def test_bench_refuses_a_set_together_with_named_models(capsys):
    data = pathlib.Path(__file__).parents[1] / "data"
    assert main(["bench", str(data / "tiny_gpt2.onnx"), "--set", "medium"]) == 2
    assert "name models or a set, not both" in capsys.readouterr().err


def test_gpt2_layers_whose_carry_broadcasts_fall_back_to_unrolled_and_match_onnxruntime():
    # AUTO_MIN_LAYERS layers: scan_layers='auto' tries a scan; GPT-2's carried position embeddings are [1, S, W]
    # on the way in and [B, S, W] on the way out, so for B > 1 the layers run unrolled, reading their own parameters.
    import dataclasses

    from onnx2jax.scan import AUTO_MIN_LAYERS

    config = dataclasses.replace(mt.TINY, layers=AUTO_MIN_LAYERS)
    model = mt.build("gpt2", config)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    translated = onnx2jax.translate(model)
    inputs = mt.inputs("gpt2", 2, 16, config)
    np.testing.assert_allclose(np.asarray(translated(**inputs)[0]), session.run(None, inputs)[0], rtol=1e-5, atol=2e-6)
