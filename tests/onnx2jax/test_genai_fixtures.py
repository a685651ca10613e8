"""The LLM fixtures of tests/data/genai (issue 20) are whole and self-consistent.

What can be checked without onnx2jax's generation: each folder has its files, genai_config.json
agrees with the model it describes (cache names and shapes, heads, head size, context length,
eos), and plain onnxruntime reproduces both the stored forward call and, by a greedy loop, the
stored tokens (onnxruntime-genai's, or transformers' for the torch export); a right-padded
GroupQueryAttention batch equals the torch export's left-padded one. Made by
scripts/make_genai_fixtures.py; see tests/data/genai/README.md.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
BUILDER_FIXTURES = ["llama_gqa", "llama_mqa", "qwen2_window", "llama_gqa_int4"]
TORCH_FIXTURES = ["llama_gqa_torch"]
ALL_FIXTURES = BUILDER_FIXTURES + TORCH_FIXTURES
# (attention heads, kv heads, head size, sliding window per layer) each fixture was made with
SHAPES = {
    "llama_gqa": (8, 2, 16, [-1, -1]),
    "llama_mqa": (4, 1, 32, [-1, -1]),
    "qwen2_window": (4, 2, 32, [-1, 8]),
    "llama_gqa_int4": (8, 2, 16, [-1, -1]),
    "llama_gqa_torch": (8, 2, 16, [-1, -1]),
}


def _expected(name: str) -> dict[str, Any]:
    return json.loads((GENAI / name / "expected_tokens.json").read_text())


def _graph(name: str) -> onnx.ModelProto:
    return onnx.load(str(GENAI / name / "model.onnx"), load_external_data=False)


def _dims(value_info: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _session(name: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(GENAI / name / "model.onnx"), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_folder_has_its_files(name):
    files = {p.name for p in (GENAI / name).iterdir()}
    needed = {"model.onnx", "tokenizer.json", "tokenizer_config.json", "expected_tokens.json"}
    needed |= {"forward.npz", "forward_batch.npz"}
    if name in BUILDER_FIXTURES:
        needed |= {"genai_config.json", "model.onnx.data"}
    assert needed <= files
    size = sum(p.stat().st_size for p in (GENAI / name).iterdir())
    assert size < 2.5 * 2**20


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_tokenizer_is_the_one_made_for_the_fixtures(name):
    """One byte-level BPE tokenizer of the model's 512 tokens in every folder (special ids 0-3)."""
    tokenizer = json.loads((GENAI / name / "tokenizer.json").read_text())
    assert tokenizer["model"]["type"] == "BPE" and tokenizer["pre_tokenizer"]["type"] == "ByteLevel"
    vocab = tokenizer["model"]["vocab"]
    assert [vocab[t] for t in ("<unk>", "<s>", "</s>", "<pad>")] == [0, 1, 2, 3] and len(vocab) == 512
    assert tokenizer == json.loads((GENAI / "llama_gqa" / "tokenizer.json").read_text())
    example = _expected(name)["text_example"]
    assert len(example["ids"]) > 0 and max(example["ids"]) < 512


@pytest.mark.parametrize("name", BUILDER_FIXTURES)
def test_genai_config_agrees_with_the_model(name):
    config = json.loads((GENAI / name / "genai_config.json").read_text())["model"]
    decoder = config["decoder"]
    heads, kv_heads, head_size, windows = SHAPES[name]
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"], decoder["head_size"]) == (
        heads,
        kv_heads,
        head_size,
    )
    model = _graph(name)
    inputs = {i.name: i for i in model.graph.input}
    outputs = {o.name: o for o in model.graph.output}
    assert decoder["filename"] == "model.onnx"
    assert set(inputs) == {decoder["inputs"]["input_ids"], decoder["inputs"]["attention_mask"]} | {
        decoder["inputs"][kind] % layer
        for kind in ("past_key_names", "past_value_names")
        for layer in range(decoder["num_hidden_layers"])
    }
    assert set(outputs) == {decoder["outputs"]["logits"]} | {
        decoder["outputs"][kind] % layer
        for kind in ("present_key_names", "present_value_names")
        for layer in range(decoder["num_hidden_layers"])
    }
    for layer in range(decoder["num_hidden_layers"]):
        for kind in ("key", "value"):
            past = _dims(inputs[decoder["inputs"][f"past_{kind}_names"] % layer])
            present = _dims(outputs[decoder["outputs"][f"present_{kind}_names"] % layer])
            # [batch, kv heads, sequence, head size]; the builder leaves head size symbolic
            assert past[1] == present[1] == kv_heads
            assert isinstance(past[2], str) and isinstance(present[2], str) and past[2] != present[2]
            assert past[3] == present[3] and past[3] in (head_size, "kv_cache_dim")
    assert _dims(outputs["logits"])[2] == config["vocab_size"]
    initializers = {t.name: list(t.dims) for t in model.graph.initializer}
    # rotary caches cover the context: [context_length, head_size / 2]
    assert initializers["cos_cache"] == [config["context_length"], head_size // 2]
    attention = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(attention) == decoder["num_hidden_layers"]
    for node, window in zip(attention, windows):
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["num_heads"], attrs["kv_num_heads"], attrs["local_window_size"]) == (heads, kv_heads, window)
    hf = _expected(name)["hf"]["config"]
    assert config["eos_token_id"] == hf["eos_token_id"] and config["pad_token_id"] == hf["pad_token_id"]
    assert config["context_length"] == hf["max_position_embeddings"]


def test_op_sets():
    """The builder's contrib ops where expected, MatMulNBits only in the int4 build, plain ONNX in the torch export."""
    ops = {name: Counter((n.domain or "ai.onnx", n.op_type) for n in _graph(name).graph.node) for name in ALL_FIXTURES}
    for name in BUILDER_FIXTURES:
        assert ops[name][("com.microsoft", "GroupQueryAttention")] == 2
        assert ops[name][("com.microsoft", "SkipSimplifiedLayerNormalization")] > 0
    assert ops["llama_gqa_int4"][("com.microsoft", "MatMulNBits")] == 11
    assert ("com.microsoft", "MatMulNBits") not in ops["llama_gqa"]
    assert {domain for domain, _ in ops["llama_gqa_torch"]} == {"ai.onnx"}


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_expected_tokens_are_well_formed(name):
    expected = _expected(name)
    assert expected["max_length"] >= max(len(p) for p in expected["prompts"])
    for prompt, tokens in zip(expected["prompts"], expected["tokens"], strict=True):
        assert tokens[: len(prompt)] == prompt and len(prompt) < len(tokens) <= expected["max_length"]
    if name in BUILDER_FIXTURES:
        # onnxruntime-genai's batch: right-padded prompts, pads kept, max_length counting them
        batch = expected["batch_right_padded"]
        width = max(len(p) for p in expected["prompts"])
        for prompt, single, row in zip(expected["prompts"], expected["tokens"], batch["tokens"], strict=True):
            padded = prompt + [batch["pad_token_id"]] * (width - len(prompt))
            assert row == (padded + single[len(prompt):])[: expected["max_length"]]
        # eos_token_id overridden to a token of the first continuation: onnxruntime-genai stops at
        # its first generated occurrence, leaving it out of a single sequence, keeping it in a
        # batch row, whose later steps are pads
        override = expected["eos_override"]
        eos = override["eos_token_id"]
        for prompt, single, stopped, row in zip(
            expected["prompts"], expected["tokens"], override["tokens"], override["batch_right_padded"], strict=True
        ):
            continuation = single[len(prompt) :]
            if eos in continuation:
                cut = continuation[: continuation.index(eos)]
                assert stopped == prompt + cut
                padded = prompt + [batch["pad_token_id"]] * (width - len(prompt))
                pads = [batch["pad_token_id"]] * expected["max_length"]
                assert row == (padded + cut + [eos] + pads)[: expected["max_length"]]
            else:
                assert stopped == single
    else:
        assert expected["equals_genai_tokens_of"] == {"llama_gqa": True}
        assert expected["tokens"] == _expected("llama_gqa")["tokens"]


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_onnxruntime_reproduces_the_stored_forward_call(name):
    stored = np.load(GENAI / name / "forward.npz")
    session = _session(name)
    feeds = {i.name: stored[i.name] for i in session.get_inputs()}
    past = feeds[session.get_inputs()[-1].name]
    assert past.shape[2] > 0  # a real decode/chunk step, with a past
    for output, value in zip(session.get_outputs(), session.run(None, feeds), strict=True):
        np.testing.assert_allclose(value, stored[f"out:{output.name}"], rtol=1e-4, atol=1e-4)


def _greedy(
    session: ort.InferenceSession, prompt: list[int], max_length: int, eos: int, kv_heads: int, head_size: int
) -> list[int]:
    """Plain onnxruntime greedy decoding: the prompt in one call, then one token a call, up to eos."""
    types = {i.name: np.int32 if "int32" in i.type else np.int64 for i in session.get_inputs()}
    past = {n: np.zeros((1, kv_heads, 0, head_size), np.float32) for n in types if n.startswith("past_key_values")}
    tokens, new = list(prompt), list(prompt)
    while len(tokens) < max_length:
        start = len(tokens) - len(new)
        feeds = dict(past)
        feeds["input_ids"] = np.array([new], types["input_ids"])
        feeds["attention_mask"] = np.ones((1, len(tokens)), types["attention_mask"])
        if "position_ids" in types:
            feeds["position_ids"] = np.arange(start, len(tokens), dtype=types["position_ids"])[None]
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
        tokens.append(int(np.argmax(outputs["logits"][0, -1])))
        if tokens[-1] == eos:
            break
        past = {n: outputs[n.replace("past_key_values", "present")] for n in past}
        new = tokens[-1:]
    return tokens


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_onnxruntime_greedy_loop_gives_the_stored_tokens(name):
    expected = _expected(name)
    _, kv_heads, head_size, _ = SHAPES[name]
    session = _session(name)
    for prompt, tokens in zip(expected["prompts"], expected["tokens"], strict=True):
        eos = expected["hf"]["config"]["eos_token_id"]
        assert _greedy(session, prompt, expected["max_length"], eos, kv_heads, head_size) == tokens


@pytest.mark.parametrize("name", ALL_FIXTURES)
def test_onnxruntime_reproduces_the_stored_padded_batch(name):
    stored = np.load(GENAI / name / "forward_batch.npz")
    session = _session(name)
    for step in ("prefill", "decode"):
        feeds = {i.name: stored[f"{step}:{i.name}"] for i in session.get_inputs()}
        for output, value in zip(session.get_outputs(), session.run(None, feeds), strict=True):
            np.testing.assert_allclose(value, stored[f"{step}:out:{output.name}"], rtol=1e-4, atol=1e-4)


def test_right_padded_gqa_batch_equals_left_padded_torch_batch():
    """Same weights, two paddings: GroupQueryAttention's right-padded batch and the torch export's
    left-padded one give the same logits at every real position, prefill and decode."""
    gqa = np.load(GENAI / "llama_gqa" / "forward_batch.npz")
    torch_export = np.load(GENAI / "llama_gqa_torch" / "forward_batch.npz")
    lengths = gqa["prefill:attention_mask"].sum(axis=1)
    width = gqa["prefill:attention_mask"].shape[1]
    for row, length in enumerate(lengths):
        right = gqa["prefill:out:logits"][row, :length]
        left = torch_export["prefill:out:logits"][row, width - length :]
        np.testing.assert_allclose(right, left, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(gqa["decode:input_ids"], torch_export["decode:input_ids"])
    np.testing.assert_allclose(gqa["decode:out:logits"], torch_export["decode:out:logits"], rtol=1e-4, atol=1e-4)
