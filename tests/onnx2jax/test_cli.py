"""The `onnx2jax` command line: demo, run and conformance."""

import pathlib

import numpy as np

from onnx2jax.cli.app import main

DATA = pathlib.Path(__file__).parents[1] / "data"


def test_demo_is_tensor_parallel_and_matches_the_unsharded_run(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "collectives per call: all-reduce 5;" in out  # and no other kind
    assert "on 8 devices" in out and "OK" in out
    assert len(out.splitlines()) <= 6, out  # quiet by default
    assert main(["demo", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "collectives: all-reduce 5, all-gather 0, all-to-all 0, collective-permute 0, reduce-scatter 0" in out


def test_run_with_given_inputs_checks_against_onnxruntime(tmp_path, capsys):
    ids = np.random.default_rng(1).integers(0, 256, (2, 5)).astype(np.int64)
    np.save(tmp_path / "ids.npy", ids)
    assert main(["run", str(DATA / "tiny_gpt2.onnx"), "--input", f"input_ids={tmp_path / 'ids.npy'}", "--check"]) == 0
    out = capsys.readouterr().out
    assert "logits: shape (2, 5, 256) dtype float32" in out
    diff = float(out.split("max |diff| vs onnxruntime")[1].split()[0])
    assert diff < 1e-4


def test_run_sharded_annotated_model(tmp_path, capsys):
    annotated = tmp_path / "bert_tp8.onnx"
    assert main(["annotate", str(DATA / "tiny_bert.onnx"), "--plan", "megatron", "--devices", "8", "-o", str(annotated)]) == 0
    capsys.readouterr()
    assert main(["run", str(annotated), "--devices", "8", "--dim", "batch=2", "--dim", "seq=8", "--check"]) == 0
    out = capsys.readouterr().out
    assert "last_hidden_state: shape (2, 8, 64)" in out and "collectives per call: all-reduce 5;" in out


def test_conformance_prints_passed_over_total(capsys):
    assert main(["conformance", "--op", "Relu"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    passed, total = out.split()[0].split("/")
    assert int(total) >= 1 and passed == total
