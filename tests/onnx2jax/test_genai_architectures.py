"""Every architecture onnxruntime-genai's model builder writes on CPU (tests/data/genai/arch, made by
scripts/make_genai_arch_fixtures.py): onnx2jax.generate gives onnxruntime-genai's STORED greedy tokens on 1
device and tensor-parallel on 8 (issue 28, item 4).

Each folder is a 2-layer random-weight model of one architecture and precision (fp32, int4). The default run
covers what no other test does (gemma2's ring cache and soft-capping on 1 and 8 devices, gemma3 on 8, a pad
id outside the vocabulary, LongRoPE, qwen3, int4 on 8); every other (folder, devices) case, and every right-padded batch, is marked slow
(``pytest -m slow``). A case compiles one prefill and one decode program (about 5 s of CPU on 1 device, more
on 8); the 8-device cases also check that the cache is split by KV heads (2 ways, each part on 4 devices).
"""

import json
import pathlib

import numpy as np
import pytest

import onnx2jax
from onnx2jax.runtime.decoder import Decoder
from onnx2jax.runtime.generate_sharding import cache_bytes_per_device

ARCH = pathlib.Path(__file__).parents[1] / "data" / "genai" / "arch"
FOLDERS = sorted(p.name for p in ARCH.iterdir() if (p / "expected_tokens.json").exists())
# the default run: the ring cache and soft-capping (gemma2) and gemma3 (ring, q/k norms) on 8 devices, the pad
# outside the vocabulary, LongRoPE, qwen3, and int4 on 8
DEFAULT = {("gemma2_fp32", 8), ("gemma3_fp32", 8), ("qwen2_pad_oov_fp32", 1),
           ("phi3_longrope_fp32", 1), ("qwen3_fp32", 1), ("llama_int4", 8)}


def cases(default: set) -> list:
    return [
        pytest.param(name, devices, marks=() if (name, devices) in default else pytest.mark.slow,
                     id=f"{name}-{devices}")
        for name in FOLDERS for devices in (1, 8)
    ]


@pytest.fixture(scope="module")
def decoders():
    """One Decoder per (folder, devices), shared by the single-prompt and batch tests of the module."""
    made: dict[tuple[str, int], Decoder] = {}

    def get(name: str, devices: int) -> Decoder:
        if (name, devices) not in made:
            made[(name, devices)] = onnx2jax.load(ARCH / name, devices=devices if devices > 1 else None)
        return made[(name, devices)]

    return get


def expected(name: str) -> dict:
    return json.loads((ARCH / name / "expected_tokens.json").read_text())


def test_every_builder_architecture_has_its_fixtures():
    """The folders the script stores: fp32 and int4 of each architecture that builds and runs on CPU."""
    archs = {"llama", "mistral", "qwen2", "qwen2_pad_oov", "qwen3", "phi3", "phi3_longrope", "gemma", "gemma2",
             "gemma3", "granite", "olmo", "nemotron", "smollm3", "phi", "ernie4_5"}
    assert {f"{a}_{p}" for a in archs for p in ("fp32", "int4")} <= set(FOLDERS)
    sizes = {name: sum(f.stat().st_size for f in (ARCH / name).iterdir()) for name in FOLDERS}
    assert max(sizes.values()) < 2**19, sizes


@pytest.mark.parametrize("name, devices", cases(DEFAULT))
def test_greedy_tokens_equal_onnxruntime_genai(name, devices, decoders):
    want = expected(name)
    decoder = decoders(name, devices)
    for prompt, tokens in zip(want["prompts"], want["tokens"]):
        got = onnx2jax.generate(decoder, prompt, max_length=want["max_length"])
        assert got.tolist() == [tokens], prompt
    assert decoder.traces == {"prefill": 1, "decode": 1, "recompute": 0}  # three prompts, one program each
    if devices > 1:
        # 2 KV heads on 8 devices: split in 2 groups of 4 devices where the plan splits the key/value
        # projections (packed q|k|v), whole on every device where it keeps them whole (said in the note)
        ways = decoder.placement.cache_ways
        said = {1: "it is whole on every device", 2: "split 2 ways by KV heads, each part on 4 devices"}
        assert said[ways] in decoder.placement.note
        cache = decoder.empty_cache(1, want["max_length"])
        assert cache_bytes_per_device(cache) * ways == sum(c.nbytes for c in cache)


@pytest.mark.parametrize("name, devices", cases(set()))
def test_right_padded_batch_equals_onnxruntime_genai(name, devices, decoders):
    want = expected(name)
    if "tokens" not in want["batch_right_padded"]:  # onnxruntime-genai failed on it: its error is stored
        pytest.skip(f"no reference: {want['batch_right_padded']['error']}")
    got = onnx2jax.generate(decoders(name, devices), want["prompts"], max_length=want["max_length"])
    assert got.tolist() == want["batch_right_padded"]["tokens"]


def test_gemma2_local_layer_has_a_ring_cache():
    """gemma2's layer 0 (sliding window 8, sliding_window_cache=1) gets a cache of the window's 8 positions,
    as genai_config.json's sliding_window block says; layer 1 the whole run's."""
    config = json.loads((ARCH / "gemma2_fp32" / "genai_config.json").read_text())["model"]["decoder"]
    assert config["sliding_window"]["layers"] == [0] and config["sliding_window"]["window_size"] == 8
    decoder = onnx2jax.load(ARCH / "gemma2_fp32")
    shapes = [c.shape[2] for c in decoder.empty_cache(1, 24)]
    assert shapes == [8, 8, 24, 24]  # past_key_values.0.key/value, then layer 1's


@pytest.mark.parametrize("name, devices", [
    pytest.param("phi3_longrope_fp32", 1, id="phi3_longrope_fp32-1"),
    pytest.param("phi3_longrope_fp32", 8, marks=pytest.mark.slow, id="phi3_longrope_fp32-8"),
    pytest.param("phi3_longrope_int4", 1, marks=pytest.mark.slow, id="phi3_longrope_int4-1"),
    pytest.param("phi3_longrope_int4", 8, marks=pytest.mark.slow, id="phi3_longrope_int4-8"),
])
def test_longrope_past_the_original_context(name, devices, decoders):
    """A 48-token run crosses original_max_position_embeddings (32): the long rope factors start where
    onnxruntime-genai's (growing) mask passes 32 columns, though the decode program's mask is as wide as its
    buffer (runtime/total_length.py), and it still compiles one prefill and one decode program."""
    run = expected(name)["long_run"]
    decoder = decoders(name, devices)
    before = dict(decoder.traces)
    got = onnx2jax.generate(decoder, run["prompt"], max_length=run["max_length"])
    assert got.tolist() == [run["tokens"]]
    assert decoder.traces["prefill"] - before["prefill"] == 1 and decoder.traces["decode"] - before["decode"] == 1


@pytest.mark.parametrize("width", [5, 40])
def test_longrope_call_equals_onnxruntime(width, decoders):
    """A plain call of the loaded handle (the rewritten If fed the mask's width) gives onnxruntime's logits on
    the unmodified file, on either side of the switch at 32 columns (a past buffer of 48 positions)."""
    ort = pytest.importorskip("onnxruntime")
    folder = ARCH / "phi3_longrope_fp32"
    decoder = decoders("phi3_longrope_fp32", 1)
    rng = np.random.default_rng(width)
    feed = {
        "input_ids": rng.integers(0, 256, (1, 1), dtype=np.int64),
        "attention_mask": np.ones((1, width), np.int64),
        **{n: rng.standard_normal((1, 2, 48, 16)).astype(np.float32) for n in decoder.layout.past},
    }
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(["logits"], feed)[0]
    got = dict(zip(decoder.model.output_names, decoder(**feed)))["logits"]
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-4)
