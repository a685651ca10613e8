"""``onnx2jax generate``: streamed tokens equal to onnxruntime-genai's stored ones, timings, and the optional
packages (tokenizers, onnxruntime-genai) said by name when missing."""

import importlib.util
import os
import subprocess
import sys
import json
import pathlib
import re

import pytest

from onnx2jax.cli.app import main

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"


def stored(name: str) -> dict:
    return json.loads((GENAI / name / "expected_tokens.json").read_text())


FIGURES = re.compile(
    r"load (?P<load>[\d.]+)s; time to first token (?P<ttft>[\d.]+)s from the start \(load included; prefill "
    r"(?P<prefill>[\d.]+)s, .+ included\); (?P<new>\d+) new tokens; decode program (?P<program>[\d.]+)s "
    r"\((compile|executable from cache|compile \d+ of \d+ programs, the rest from cache)\); decode "
    r"(?P<decoded>\d+) tokens in (?P<decode_ms>[\d.]+) ms: (?P<rate>[\d.]+) tokens/s$"
)


def _figures(line: str) -> dict:
    """The figures line read back, checked for consistency: the time to first token counts the load and the
    prefill, the rate is the decoded tokens over the decode time printed, which starts once the decode program
    is compiled (its compile printed apart: timings themselves are not tested)."""
    found = FIGURES.match(line)
    assert found, line
    f = {k: (int(v) if k in ("new", "decoded") else float(v)) for k, v in found.groupdict().items()}
    assert f["ttft"] >= f["load"] >= 0 and abs(f["ttft"] - f["load"] - f["prefill"]) <= 2e-3
    assert f["decoded"] == f["new"] - 1
    ms = f["decode_ms"]  # printed to 0.01 ms: the rate within that rounding
    assert f["decoded"] / (ms + 0.005) * 1e3 - 0.05 <= f["rate"] <= f["decoded"] / max(ms - 0.005, 1e-9) * 1e3 + 0.05
    return f


class _Counted:
    """A jitted program whose calls record their last argument (the decode's step count); lowering passes on."""

    def __init__(self, jitted, asked: list[int]):
        self.jitted, self.asked = jitted, asked

    def __call__(self, *args):
        self.asked.append(int(args[-1]))
        return self.jitted(*args)

    def __getattr__(self, name):
        return getattr(self.jitted, name)


class _Terminal:
    """A stdout that keeps what was written at each flush, with the decode program's calls made by then."""

    def __init__(self, asked: list[int]):
        self.text, self.flushes, self.asked = "", [], asked

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        self.flushes.append((self.text, sum(1 for n in self.asked if n > 0)))


@pytest.mark.parametrize("name", ["llama_gqa", "llama_gqa_torch"])
def test_generate_prints_each_token_before_the_next_step_runs_then_the_figures(name, monkeypatch):
    """The CLI streams token by token (issue 29 item 3): each flush shows one token more, written before the
    decode program ran the next step (its calls counted: one step each); the tokens are onnxruntime-genai's
    stored ones (transformers' for the torch export); then the time to first token and the rate."""
    import onnx2jax
    from onnx2jax.runtime.sampling import Search

    want = stored(name)
    prompt, tokens = want["prompts"][0], want["tokens"][0]
    decoder = onnx2jax.load(GENAI / name)  # held: the CLI's load returns this handle
    program = decoder.decode(Search())
    asked: list[int] = []
    jitted = program._jitted
    monkeypatch.setattr(program, "_jitted", _Counted(jitted, asked))
    terminal = _Terminal(asked)
    monkeypatch.setattr(sys, "stdout", terminal)
    args = ["generate", str(GENAI / name), "--prompt-ids", ",".join(map(str, prompt)), "--max-new-tokens", "6"]
    assert main(args) == 0
    out = terminal.text.splitlines()
    assert out[0] == " ".join(map(str, prompt)) + " | " + " ".join(map(str, tokens[len(prompt):len(prompt) + 6]))
    figures = _figures(out[1])
    assert figures["new"] == 6 and figures["decoded"] == 5
    on_line = [(text.split("|")[1].split(), calls) for text, calls in terminal.flushes if "\n" not in text]
    assert [len(shown) for shown, _ in on_line] == list(range(7))  # the prompt, then one token more each flush
    # the decode program readied after the first token (a step run ahead: compile_decode), then token k printed
    # after k decode steps and before step k + 1
    assert [calls for _, calls in on_line] == [0, 0, 2, 3, 4, 5, 6]
    assert asked == [1] * 6


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
    assert "pip install tokenizers (in a clone of onnx2jax: pip install -e '.[text]')" in capsys.readouterr().err


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


def test_a_second_run_loads_its_programs_from_the_persistent_cache(tmp_path):
    # in subprocesses, as tests/onnx2jax/test_compilation_cache.py runs `run`: the cache is process-wide
    root = pathlib.Path(__file__).parents[2]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(root)}
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    args = ["generate", str(GENAI / "llama_gqa_torch"), "--prompt-ids", "1,42,7", "--max-new-tokens", "5",
            "--cache", str(tmp_path / "c")]
    lines = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=root)
        assert done.returncode == 0, done.stderr
        lines.append(done.stdout.splitlines()[1])
    assert "s, compile included)" in lines[0] and "s, executable from cache included)" in lines[1]
    assert any(name.startswith("jit_") for name in os.listdir(tmp_path / "c"))
    assert _figures(lines[0])["new"] == _figures(lines[1])["new"] == 5
