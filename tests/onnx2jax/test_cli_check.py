"""`onnx2jax check` and `onnx2jax explain` on the Megatron-annotated GPT-2 fixture."""

import json
from pathlib import Path

import onnx
import pytest

from onnx2jax.cli.app import main
from sharding.megatron import megatron_plan

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")  # rich folds long names in narrow tables


@pytest.fixture(scope="module")
def annotated(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "gpt2_tp.onnx"
    onnx.save(megatron_plan(onnx.load(DATA / "tiny_gpt2.onnx"), 8), path)
    return path


@pytest.fixture(scope="module")
def broken(annotated, tmp_path_factory):
    model = onnx.load(annotated)
    node = next(n for n in model.graph.node if n.name == "node_addmm_3")  # row-parallel MLP down
    spec = next(s for s in node.device_configurations[0].sharding_spec if s.tensor_name == node.input[1])
    spec.sharded_dim[0].axis = 1
    path = tmp_path_factory.mktemp("cli") / "broken.onnx"
    onnx.save(model, path)
    return path


def test_check_valid_model_exits_0_with_a_summary(annotated, capsys):
    assert main(["check", str(annotated)]) == 0
    assert "no errors" in capsys.readouterr().out


def test_check_invalid_model_exits_1_with_a_table(broken, capsys):
    assert main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "k-sharding-mismatch" in out and "node_addmm_3" in out and "1 error(s)" in out


def test_check_json(broken, capsys):
    assert main(["check", str(broken), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is False and report["counts"]["error"] == 1
    [error] = [d for d in report["diagnostics"] if d["severity"] == "error"]
    assert error["node"] == "node_addmm_3" and error["axis"] == 0 and error["hint"]


def test_explain_lists_written_and_inferred_specs_and_draws_tiles(annotated, capsys):
    assert main(["explain", str(annotated), "--tensor", "view_3", "--input-shape", "input_ids=2,16"]) == 0
    short = capsys.readouterr().out
    assert "node_Split_263" not in short and "view_3 [2, 16, 8, 8]: 2:8 @ [0,1,2,3,4,5,6,7]" in short
    assert "collectives the specs imply: 5, at node_embedding, " in short
    assert main(["explain", str(annotated), "--tensor", "view_3", "--input-shape", "input_ids=2,16", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "node_Split_263" in out and "2:(3x1,64x8)" in out
    assert "view_3 [2, 16, 8, 8]: 2:8 @ [0,1,2,3,4,5,6,7]" in out
    assert "│ 0 │ 1 │ 2 │ 3 │ 4 │ 5 │ 6 │ 7 │" in out


def test_explain_shows_reshards(tmp_path, annotated, capsys):
    model = onnx.load(annotated)
    node = next(n for n in model.graph.node if n.name == "node_addmm")
    spec = next(s for s in node.device_configurations[0].sharding_spec if s.tensor_name == "addmm")
    del spec.sharded_dim[:]
    del spec.device[:]
    spec.device.append(-1)
    spec.index_to_device_group_map.add(key=-1, value=list(range(8)))
    path = tmp_path / "reshard.onnx"
    onnx.save(model, path)
    assert main(["explain", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    row = next(r for r in report["nodes"] if r["tensor"] == "addmm")
    assert row["reshard"] == "all-gather" and row["given"].startswith("replicated")


def test_explain_write_completes_the_annotations(annotated, tmp_path, capsys):
    out = tmp_path / "full.onnx"
    assert main(["explain", str(annotated), "--write", str(out), "--json"]) == 0
    capsys.readouterr()
    full = onnx.load(out)
    annotated_nodes = [n for n in full.graph.node if n.device_configurations]
    assert len(annotated_nodes) > 60
    assert main(["check", str(out)]) == 0


def test_bad_input_shape_option(annotated, capsys):
    assert main(["check", str(annotated), "--input-shape", "input_ids"]) == 2
    assert "--input-shape expects NAME=D0,D1,..." in capsys.readouterr().err
