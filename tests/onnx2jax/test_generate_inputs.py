"""Generation's inputs checked and its mistakes named (issue 28, item 5): token ids against the vocabulary in
generate, Generator and the CLI (as ``run`` refuses them), --prompt-ids read with commas or spaces, a folder
without genai_config.json named, too many devices a DeviceCountError with the hint.

Every check here fires before anything is compiled: the tests cost a translation of the tiny llama_gqa
fixture, not a generation.
"""

import json
import pathlib
import shutil

import numpy as np
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.errors import DeviceCountError, InputError, InputRangeError
from onnx2jax.genai_config import GenaiConfigError
from onnx2jax.runtime.generate import Generator

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
VOCAB = 512  # llama_gqa's embedding rows (genai_config.json vocab_size)


@pytest.fixture(scope="module")
def decoder():
    return onnx2jax.load(GENAI / "llama_gqa")


@pytest.mark.parametrize("prompt, where", [
    ([1, 17, VOCAB], "token id 512 at prompt 0, position 2"),
    ([1, -1, 230], "token id -1 at prompt 0, position 1"),
    ([[1, 2], [1, 99999]], "token id 99999 at prompt 1, position 1"),
    (np.array([[1, 2, 3], [4, 5, VOCAB + 7]]), "token id 519 at prompt 1, position 2"),
])
def test_token_ids_outside_the_vocabulary_are_refused(decoder, prompt, where):
    with pytest.raises(InputRangeError, match=rf"{where} \('input_ids'\) is outside the vocabulary \[0, 512\)"):
        onnx2jax.generate(decoder, prompt, max_new_tokens=2)
    with pytest.raises(InputRangeError, match="outside the vocabulary"):
        Generator(decoder, prompt, max_new_tokens=2)


@pytest.mark.parametrize("prompt, what", [
    ([1.0, 17.0, 230.0], r"prompt 0, position 0 is 1.0 \(float\)"),
    ([[1, 2], [3, 4.5]], r"prompt 1, position 1 is 4.5 \(float\)"),
    (np.array([1.0, 17.0]), "an array of float64"),
    ([1, True], r"prompt 0, position 1 is True \(bool\)"),
])
def test_ids_that_are_not_integers_are_refused(decoder, prompt, what):
    with pytest.raises(InputError, match=what):
        onnx2jax.generate(decoder, prompt, max_new_tokens=2)


def test_pads_around_the_rows_of_an_array_are_not_token_ids(decoder):
    """A 2-D array's rows padded with pad_token_id (stripped): the pads are no prompt ids, even outside the
    vocabulary; the prompts themselves are checked."""
    ids = np.array([[1, 17, 230], [VOCAB, 1, 42]])
    generator = Generator(decoder, ids, max_new_tokens=0, pad_token_id=VOCAB)
    assert generator.prompts == [[1, 17, 230], [1, 42]]


def test_cli_reads_prompt_ids_with_commas_spaces_or_both(capsys):
    """"1 17 230" is three ids (it was read as 117230); --max-new-tokens 0 prints the prompt as read."""
    for text in ["1 17 230", "1,17,230", "1, 17 , 230"]:
        assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", text, "--max-new-tokens", "0"]) == 0
        assert capsys.readouterr().out.splitlines()[0] == "1 17 230 |"


@pytest.mark.parametrize("text", ["1,17.5", "1 a 3", "1,,3"])
def test_cli_refuses_prompt_ids_that_are_not_integers(text, capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", text, "--max-new-tokens", "2"]) == 2
    assert "--prompt-ids takes integers separated by commas or spaces" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["1,17,512", "-1 5"])
def test_cli_refuses_ids_outside_the_vocabulary(text, capsys):
    assert main(["generate", str(GENAI / "llama_gqa"), "--prompt-ids", text, "--max-new-tokens", "2"]) == 1
    assert "is outside the vocabulary [0, 512)" in capsys.readouterr().err


def test_a_builder_folder_without_genai_config_names_the_missing_file(tmp_path):
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(GENAI / "llama_gqa" / name, tmp_path / name)
    with pytest.raises(GenaiConfigError, match=rf"{tmp_path}/genai_config.json is missing: the cache input "
                                               r"'past_key_values.0.key' has shape \['batch_size', 2, "):
        onnx2jax.generate(tmp_path, [1, 17], max_new_tokens=2)


def test_more_devices_than_jax_has_is_a_device_count_error_with_the_hint():
    with pytest.raises(DeviceCountError, match=r"needs 16 devices, JAX has 8; on CPU, start Python with "
                                               r"XLA_FLAGS=--xla_force_host_platform_device_count=16"):
        onnx2jax.generate(GENAI / "llama_gqa", [1, 17], max_new_tokens=2, devices=16)


def test_the_stored_vocabulary_is_the_embedding_table(decoder):
    """The bound the checks use is the size of the table input_ids gathers from (as ``run`` finds it),
    which for this fixture is genai_config.json's vocab_size."""
    config = json.loads((GENAI / "llama_gqa" / "genai_config.json").read_text())
    assert decoder.vocab == config["model"]["vocab_size"] == VOCAB
