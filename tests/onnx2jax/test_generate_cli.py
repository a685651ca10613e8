"""``onnx2jax generate``: streamed tokens equal to onnxruntime-genai's stored ones, timings, and the optional
packages (tokenizers, onnxruntime-genai) said by name when missing."""

import importlib.util
import sys
import json
import pathlib
import re

import pytest

from onnx2jax.cli.app import main

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"


def stored(name: str) -> dict:
    return json.loads((GENAI / name / "expected_tokens.json").read_text())


@pytest.mark.parametrize("name", ["llama_gqa", "llama_gqa_torch"])
def test_generate_prints_the_tokens_then_time_to_first_token_and_rate(name, capsys):
    want = stored(name)
    prompt, tokens = want["prompts"][0], want["tokens"][0]
    args = ["generate", str(GENAI / name), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "6"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == " ".join(map(str, prompt)) + " | " + " ".join(map(str, tokens[len(prompt):len(prompt) + 6]))
    figures = _figures(out[1])
    assert figures["new"] == 6 and figures["decoded"] == 5


FIGURES = re.compile(
    r"load (?P<load>[\d.]+)s; time to first token (?P<ttft>[\d.]+)s from the start \(load included; prefill "
    r"(?P<prefill>[\d.]+)s, .+ included\); (?P<new>\d+) new tokens; decode (?P<decoded>\d+) tokens in "
    r"(?P<decode>[\d.]+)s: (?P<rate>[\d.]+) tokens/s$"
)


def _figures(line: str) -> dict:
    """The figures line read back, checked for consistency: the time to first token counts the load and the
    prefill, the rate is the decoded tokens over the decode time printed (timings themselves are not tested)."""
    found = FIGURES.match(line)
    assert found, line
    f = {k: (int(v) if k in ("new", "decoded") else float(v)) for k, v in found.groupdict().items()}
    assert f["ttft"] >= f["load"] > 0 and abs(f["ttft"] - f["load"] - f["prefill"]) <= 2e-3
    assert f["decoded"] == f["new"] - 1
    assert f["rate"] == pytest.approx(f["decoded"] / f["decode"], rel=1e-2, abs=0.1)
    return f


def test_generate_sampled(capsys):
    args = ["generate", str(GENAI / "llama_gqa"), "--prompt-ids", "1,42", "--max-new-tokens", "5", "--sample",
            "--temperature", "1.5", "--top-p", "0.9", "--seed", "4"]
    assert main(args) == 0
    first, timing = capsys.readouterr().out.splitlines()
    assert first.startswith("1 42 | ") and len(first.split("|")[1].split()) == 5 and _figures(timing)["new"] == 5


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is not None, reason="onnxruntime-genai installed")
def test_check_without_onnxruntime_genai_says_so(capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", "1,42", "--check"]) == 1
    assert "--check needs onnxruntime-genai, which is not installed" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("onnxruntime_genai") is None, reason="onnxruntime-genai not installed")
def test_check_with_onnxruntime_genai(capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", "1,42", "--max-new-tokens", "8", "--check"]) == 0
    assert "check: the same 10 tokens as onnxruntime-genai" in capsys.readouterr().out


def test_text_prompt_without_tokenizers_says_which_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if the 'text' extra were not installed
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt", "the small model"]) == 1
    assert "pip install 'onnx2jax[text]'" in capsys.readouterr().err


def test_text_prompt_is_tokenized_and_decoded(capsys):
    example = stored("llama_gqa")["text_example"]
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt", example["text"], "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(example["text"]) and _figures(out[1])["new"] == 3


def test_a_prompt_longer_than_the_context_is_one_line(capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", ",".join(["5"] * 257)]) == 1
    err = capsys.readouterr().err
    assert "onnx2jax generate: error: the prompt has 257 tokens, longer than the model's context of 256" in err


def test_generate_on_two_devices(capsys):
    want = stored("llama_gqa_torch")
    args = ["generate", str(GENAI / "llama_gqa_torch"), "--prompt-ids", "1,42", "--max-new-tokens", "4", "--devices", "2"]
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == "1 42 | " + " ".join(map(str, want["tokens"][2][2:6]))
