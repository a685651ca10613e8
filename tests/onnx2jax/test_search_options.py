"""genai_config.json's search options (issue 29 item 2): those implemented are the defaults of generation, the
CLI and the server's requests, each overridable; any other is refused by name, never ignored. Here without a
model: the options read and refused, the CLI refusing before it loads anything, and a request's parameters
from the folder's defaults (the tokens they give: test_generate.py, test_generate_cli.py and
test_serving_server.py, against onnxruntime and onnxruntime-genai)."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from onnx2jax.cli.app import main
from onnx2jax.errors import SearchOptionError
from onnx2jax.runtime.search_options import SearchDefaults, folder_defaults, search_defaults
from onnx2jax.serving import openai_api as api

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
BUILDER_SEARCH = json.loads((GENAI / "llama_gqa" / "genai_config.json").read_text())["search"]


def test_the_builders_search_section_reads_as_onnxruntime_genai_defaults():
    assert search_defaults(BUILDER_SEARCH, "x") == SearchDefaults(
        do_sample=False, temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0, seed=None)
    assert search_defaults({}) is None  # no genai_config.json: the caller's own defaults
    assert search_defaults({"do_sample": True, "random_seed": 7, "repetition_penalty": 1.2}).seed == 7
    assert search_defaults({"do_sample": True}).top_k == 50  # onnxruntime-genai's own where the config is silent


@pytest.mark.parametrize("option, value", [
    ("num_beams", 4), ("num_return_sequences", 2), ("min_length", 5), ("no_repeat_ngram_size", 3),
    ("diversity_penalty", 0.5), ("frobnicate", 1), ("seed", 3), ("do_sample", "yes"), ("temperature", "hot"),
])
def test_an_option_not_implemented_is_refused_by_name(option, value):
    with pytest.raises(SearchOptionError, match=f"search option {option}=.* in cfg.json") as info:
        search_defaults({**BUILDER_SEARCH, option: value}, "cfg.json")
    assert info.value.option == option and info.value.value == value


def test_beam_only_options_change_nothing_with_one_beam():
    assert search_defaults({**BUILDER_SEARCH, "length_penalty": 2.0, "early_stopping": False}) == \
        search_defaults(BUILDER_SEARCH)


def _folder(tmp_path, **search) -> pathlib.Path:
    config = json.loads((GENAI / "llama_gqa" / "genai_config.json").read_text())
    config["search"].update(search)
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    return tmp_path


def test_generate_and_serve_refuse_num_beams_before_loading(tmp_path, capsys, monkeypatch):
    folder = _folder(tmp_path, num_beams=4)  # no model.onnx: nothing is loaded before the refusal
    assert main(["generate", str(folder), "--prompt-ids", "1,42"]) == 1
    assert "search option num_beams=4" in capsys.readouterr().err
    monkeypatch.delenv("PJRT_NPROC", raising=False)
    assert main(["serve", str(folder)]) == 1
    err = capsys.readouterr().err
    assert "search option num_beams=4" in err and "beam search is not implemented" in err
    # a refused command changes nothing: serve's XLA thread count (once left in the environment by this very
    # call, it ran every later subprocess of the test session on one thread) is set only after its refusals
    assert "PJRT_NPROC" not in os.environ
    assert folder_defaults(GENAI / "llama_gqa") == search_defaults(BUILDER_SEARCH)


@pytest.mark.parametrize("flags, refused", [
    (["--temperature", "0.7"], "--temperature"),
    (["--top-k", "5", "--top-p", "0.5"], "--top-k, --top-p"),
    (["--seed", "3", "--no-sample"], "--seed"),
])
def test_sampling_flags_on_a_greedy_run_are_refused_not_ignored(flags, refused, capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", "1,42", *flags]) == 2  # a usage error
    err = capsys.readouterr().err
    assert f"{refused}: for sampling, and this run is greedy" in err


def test_check_on_a_folder_that_samples_asks_for_no_sample(tmp_path, capsys):
    folder = _folder(tmp_path, do_sample=True)
    assert main(["generate", str(folder), "--prompt-ids", "1,42", "--check"]) == 2
    assert "give --no-sample" in capsys.readouterr().err


@pytest.mark.parametrize("body, want", [
    ({}, dict(temperature=0.0, top_k=50, top_p=1.0, repetition_penalty=1.3, seed=9)),  # the folder's: greedy
    ({"temperature": 0.8, "top_k": 0, "repetition_penalty": 1.0, "seed": 2},
     dict(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.0, seed=2)),  # each overridden
])
def test_a_request_takes_the_folders_defaults_where_it_leaves_a_field_out(body, want):
    folder = search_defaults({**BUILDER_SEARCH, "repetition_penalty": 1.3, "random_seed": 9})
    parsed = api.parse({"model": "m", **body}, [1, 2], context=256, default_max_tokens=16, model="m", defaults=folder)
    assert {k: getattr(parsed.params, k) for k in want} == want


def test_a_folder_that_samples_gives_its_temperature_and_without_config_openais():
    folder = search_defaults({**BUILDER_SEARCH, "do_sample": True, "temperature": 0.6, "top_p": 0.9})
    params = api.parse({"model": "m"}, [1], context=256, default_max_tokens=16, model="m", defaults=folder).params
    assert (params.temperature, params.top_k, params.top_p) == (0.6, 50, 0.9)
    openai = api.parse({"model": "m"}, [1], context=256, default_max_tokens=16, model="m").params
    assert (openai.temperature, openai.top_k, openai.top_p, openai.repetition_penalty) == (1.0, 0, 1.0, 1.0)
