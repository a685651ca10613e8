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


def test_onnx2jax_data_lists_every_shipped_file_and_prints_one_path(capsys):
    from onnx2jax.cli.app import main

    assert main(["data"]) == 0
    listing = capsys.readouterr().out
    for name in FILES:
        assert f"data:{name}" in listing and str(onnx2jax.data_path(name)) in listing
    assert main(["data", "tiny_llama"]) == 0
    assert capsys.readouterr().out.strip() == str(onnx2jax.data_path("tiny_llama.onnx"))
    assert main(["data", "tiny_gpt2"]) == 1
    assert "ships no file 'tiny_gpt2'" in capsys.readouterr().err


def test_data_names_stand_for_the_shipped_paths_in_every_command_argument(monkeypatch, tmp_path):
    """``data:NAME`` as a model, in bench's model list, and as an --input file (bare or NAME=)."""
    from onnx2jax.cli import app

    seen = {}
    monkeypatch.chdir(tmp_path)  # nothing of the checkout is reachable by a relative path
    for command in app.COMMANDS:
        monkeypatch.setattr(command, "run", lambda args, c=command: seen.setdefault(c.__name__, vars(args)) and 0)
    llama, ids = str(onnx2jax.data_path("tiny_llama.onnx")), str(onnx2jax.data_path("tiny_llama.inputs.npz"))
    app.main(["run", "data:tiny_llama", "--input", "data:tiny_llama.inputs.npz", "--input", "input_ids=data:tiny_llama.inputs.npz"])
    assert seen["onnx2jax.cli.run"]["model"] == llama
    assert seen["onnx2jax.cli.run"]["input"] == [ids, f"input_ids={ids}"]
    app.main(["generate", "data:llama_gqa", "--prompt-ids", "1,2"])
    assert seen["onnx2jax.cli.generate"]["model"] == str(onnx2jax.data_path("llama_gqa"))
    app.main(["bench", "data:tiny_llama.onnx", "data:random_forest"])
    assert seen["onnx2jax.cli.bench"]["models"] == [llama, str(onnx2jax.data_path("random_forest.onnx"))]
    app.main(["demo", "--model", "data:tiny_llama"])
    assert seen["onnx2jax.cli.demo"]["model"] == llama
    for command in ("check", "explain", "export", "annotate"):
        extra = {"export": ["-o", "x.jaxexport"], "annotate": ["-o", "x.onnx"]}.get(command, [])
        app.main([command, "data:tiny_llama", *extra])
        assert seen[f"onnx2jax.cli.{command}"]["model"] == llama
