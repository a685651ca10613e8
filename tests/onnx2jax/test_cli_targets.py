"""``--target`` on the command line and ``onnx2jax targets`` (issue 41 item 2).

References: a hand count (the tiny Llama's Megatron plan at TP 8 needs 5 all-reduces: 2 blocks x (attention
out + MLP down) + the token embedding), the device counts of jax's topology spelling (v5e:2x4 is 2 x 4 chips),
and the exported program's own platform as jax reads it back.
"""

from __future__ import annotations

import json
import zipfile

import jax
import onnx
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.runtime import targets
from sharding.megatron import megatron_plan

pytestmark = pytest.mark.skipif(not targets.libtpu_available(), reason="libtpu (the test extra) is not installed")


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")


@pytest.fixture(scope="module")
def llama_tp8(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "llama_tp8.onnx"
    onnx.save(megatron_plan(onnx.load(onnx2jax.demo_model_path()), 8), path)
    return path


def test_targets_lists_topologies_with_their_device_counts(capsys):
    assert main(["targets", "--json"]) == 0
    rows = {row["target"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["tpu:v5e:2x4"]["devices"] == 2 * 4 and rows["tpu:v6e:4x4"]["devices"] == 4 * 4


def test_check_target_compiles_and_counts_the_plans_collectives(llama_tp8, capsys):
    assert main(["check", str(llama_tp8), "--target", "tpu:v5e:2x4", "--input-shape", "input_ids=1,16",
                 "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["target"]
    assert found["target"] == "tpu:v5e:2x4" and found["collectives"] == {"all-reduce": 5}
    assert found["shapes"] == {"input_ids": [1, 16]}


def test_check_target_needs_the_symbolic_dims_and_a_known_name(llama_tp8, capsys):
    assert main(["check", str(llama_tp8), "--target", "tpu:v5e:2x4"]) == 2
    assert "--input-shape input_ids=" in capsys.readouterr().err
    assert main(["check", str(llama_tp8), "--target", "v5e"]) == 2
    assert "as jax spells it" in capsys.readouterr().err
    assert main(["check", str(llama_tp8), "--slices", "2"]) == 2
    assert "--slices goes with --target" in capsys.readouterr().err


def test_export_target_writes_a_tpu_program(llama_tp8, tmp_path, capsys):
    out = tmp_path / "llama.jaxexport"
    assert main(["export", str(llama_tp8), "--target", "tpu:v5e:2x4", "--dim", "batch=1", "--dim", "seq=16",
                 "-o", str(out)]) == 0
    with zipfile.ZipFile(out) as archive:
        exported = jax.export.deserialize(bytearray(archive.read("program.bin")))
    assert exported.platforms == ("tpu",) and exported.nr_devices == 8
