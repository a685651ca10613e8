"""Automatic plans compiled on 8 fake CPU devices: never worse than the hand plan, prediction = program.

For zoo models at 2/4/8 devices with the zoo's batch (2): the automatic plan's measured collective
bytes (each collective's result, read off the compiled HLO) and parameter bytes per device (the placed
arrays) are at most those of the hand plan (`megatron_plan` given the same batch, compiled the same
way), its values equal onnxruntime's stored outputs, and its report names no difference between the
compiled program and the prediction except those listed in KNOWN (each with why).

The default suite runs a representative subset (DEFAULT: a GQA model where kv-head groups beat the
hand plan, a vision encoder at TP 4); the whole matrix is `slow`. Also here: the strictly better cases
(data parallel for a CNN among them), pipelines where nothing else fits, `annotate --auto` and its
calibration.
"""

from __future__ import annotations

import functools
import sys

import jax
import numpy as np
import onnx
import pytest
from zoo_cases import CASES, ZOO

import onnx2jax
import onnx2jax.errors
from onnx2jax.cli import main
from onnx2jax.runtime import calibration
from onnx2jax.runtime.auto_check import collective_bytes, measured
from sharding import auto_plan, describe_plan
from sharding.megatron import megatron_plan

DEFAULT = {("mistral", 8), ("vit", 4)}
MERGED = "that the program does not hold: XLA merged it"
KNOWN = {  # model or (model, devices) -> what every difference note says ("|": one of), and why
    "gpt_neox": (f"all-reduce: predicted 5, the program has 3|collective bytes: predicted 40,960, the program "
                 f"moves 24,576|{MERGED}",
                 "the parallel residual adds two partial sums before they meet: one all-reduce for two"),
    "t5": (f"all-reduce: predicted 12, the program has 11|{MERGED}",
           "XLA's combiner joins two independent all-reduces into one tuple all-reduce (tests/onnx2jax/zoo_cases.py)"),
    ("wav2vec2", 2): ("the program has 1|moves 9,728|XLA added an all-gather at node 'node_conv1d_3'",
                      "data parallel: the partitioner gathers the feature encoder's conv operands (not predicted)"),
}


def _inputs(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(ZOO / f"{name}.inputs.npz"))


def _seq(name: str) -> int:
    return max(v.shape[1] for v in _inputs(name).values() if v.ndim > 1)


def _assert_outputs_equal_onnxruntime(name, compiled, outputs):
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    for output_name, value in zip(compiled.model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[output_name], rtol=1e-4, atol=2e-5)


def _cases():
    for name in CASES:
        for devices in (2, 4, 8):
            slow = (name, devices) not in DEFAULT
            yield pytest.param(name, devices, marks=[pytest.mark.slow] if slow else [], id=f"{name}-{devices}")


@functools.lru_cache(maxsize=None)
def _auto(name: str, devices: int, batch: int = 2):
    inputs = _inputs(name)
    compiled = onnx2jax.compile(ZOO / f"{name}.onnx", devices=devices, plan="auto",
                                auto=dict(batch=batch, seq=_seq(name), calibrate=False, inputs=inputs))
    return compiled, compiled(**inputs)


@functools.lru_cache(maxsize=None)
def _hand(name: str, devices: int, batch: int | None = 2) -> dict:
    """The hand plan's measured collectives, collective bytes and parameter bytes per device."""
    inputs = _inputs(name)
    hand = onnx2jax.compile(megatron_plan(onnx.load(ZOO / f"{name}.onnx"), devices, batch=batch))
    return measured(hand.compiled_text(**inputs), hand.report(**inputs).param_bytes_per_device)


@pytest.mark.parametrize("name,devices", list(_cases()))
def test_the_automatic_plan_is_never_worse_than_the_hand_plan(name, devices):
    compiled, outputs = _auto(name, devices)
    _assert_outputs_equal_onnxruntime(name, compiled, outputs)
    report = compiled.auto_report
    auto, hand = report.measured, _hand(name, devices)
    assert auto["collective_bytes"] <= hand["collective_bytes"]
    assert auto["param_bytes"] <= hand["param_bytes"]
    known = KNOWN.get(name) or KNOWN.get((name, devices))
    if known is None:
        assert report.differences == []
        assert auto["collectives"] == report.winner.collectives
        assert (auto["collective_bytes"], auto["param_bytes"]) == (report.winner.collective_bytes,
                                                                   report.winner.param_bytes)
    else:
        assert report.differences, known[1]
        assert all(any(p in d for p in known[0].split("|")) for d in report.differences), known[1]


def test_kv_head_groups_hold_strictly_fewer_parameter_bytes_than_the_hand_plan():
    """Mistral at 8 devices: 2 kv heads, 8 query-head shards; the hand plan replicates k/v, the search
    finds the kv-head groups layout (each kv head on the 4 devices whose query heads read it)."""
    compiled, _ = _auto("mistral", 8)
    assert compiled.auto_report.winner.variant == "kv-groups"
    assert compiled.auto_report.measured["param_bytes"] < _hand("mistral", 8)["param_bytes"]
    assert compiled.auto_report.measured["collective_bytes"] == _hand("mistral", 8)["collective_bytes"]


def test_a_cnn_given_a_batch_runs_data_parallel_with_strictly_fewer_collective_bytes():
    """ResNet on 2 devices, batch 2: data parallel moves nothing; the tensor-parallel plan (the hand
    plan without a batch) all-reduces each conv pair's output."""
    compiled, _ = _auto("resnet", 2)
    assert (compiled.auto_report.winner.data, compiled.auto_report.measured["collective_bytes"]) == (2, 0)
    assert _hand("resnet", 2, None)["collective_bytes"] > 0


def test_annotate_auto_calibrates_once_writes_the_winner_and_checks_it(tmp_path, monkeypatch, capsys):
    """The CLI measures this backend's rates (cached under XDG_CACHE_HOME), writes the plan `auto_plan`
    chooses at those rates, compiles it on the 4 devices and prints the check; a second run reads the
    cached rates instead of measuring."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "vit_auto.onnx"
    argv = ["annotate", str(ZOO / "vit.onnx"), "--auto", "--devices", "4", "--batch", "2", "-o", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    cache = calibration.cache_path(jax.devices()[:4])
    assert cache.is_relative_to(tmp_path) and cache.exists()
    rates = calibration.rates(jax.devices()[:4])
    assert rates.source.startswith("calibrated on cpu") and rates.source in printed
    assert "measured = predicted (collectives, bytes, parameter bytes per device)" in printed
    annotated, report = auto_plan(onnx.load(ZOO / "vit.onnx"), 4, batch=2, rates=rates)
    expected = {(r.node, r.tensor, r.spec) for r in describe_plan(annotated)}
    assert {(r.node, r.tensor, r.spec) for r in describe_plan(onnx.load(out))} == expected
    assert f"{report.winner.name} (searched" in printed

    def no_measuring(devices):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(calibration, "measure", no_measuring)
    assert calibration.rates(jax.devices()[:4]) == rates


def test_annotate_auto_names_a_memory_limit_no_layout_meets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["annotate", str(ZOO / "gpt2.onnx"), "--auto", "--devices", "2", "--memory", "10KB",
            "-o", str(tmp_path / "x.onnx")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no layout on 2 devices fits 10,000 bytes per device: the smallest is" in err
    assert not (tmp_path / "x.onnx").exists()


def test_collective_bytes_reads_each_result_shape_of_the_hlo():
    text = """
  %all-reduce = f32[2,16,64]{2,1,0} all-reduce(%a), channel_id=2
  %ag = (f32[4]{0}, f32[16]{0}) all-gather-start(%b), dimensions={0}
  %t = (f32[8]{0}, bf16[8]{0}) all-reduce(%c, %d), channel_id=3
"""
    assert collective_bytes(text) == [("all-reduce", 2 * 16 * 64 * 4), ("all-gather", 64), ("all-reduce", 32 + 16)]


def test_a_memory_limit_no_tensor_layout_meets_gets_pipeline_stages():
    """A Llama with 2 attention heads on 8 devices: tensor parallelism splits each layer at most 2 ways
    (on groups of 4), so at 150,000 bytes per device no data x tensor layout fits; 2 stages of 4
    devices each do. The pipeline runs, equal to onnxruntime; its stages' collectives are those
    predicted, and its parameter bytes per device are within the limit."""
    import onnxruntime

    sys.path.insert(0, str(ZOO.parents[2] / "bench"))
    import medium_transformers as mt

    config = mt.Config(layers=4, width=64, heads=2, kv_heads=1, ffn=128, llama_ffn=96, vocab=256, positions=64)
    model = mt.build("llama_gqa", config)
    inputs = mt.inputs("llama_gqa", 1, 16, config)
    compiled = onnx2jax.compile(model, devices=8, plan="auto", auto=dict(
        batch=1, seq=16, memory_per_device=150_000, calibrate=False, inputs=inputs))
    report = compiled.auto_report
    assert (report.winner.pipeline, report.winner.tensor) == (2, 4)
    assert all(not r.fits for r in report.rows if r.pipeline == 1)
    (expected,) = onnxruntime.InferenceSession(model.SerializeToString()).run(None, inputs)[:1]
    np.testing.assert_allclose(np.asarray(compiled(**inputs)[0]), expected, rtol=1e-4, atol=2e-5)
    assert report.measured["collectives"] == report.winner.collectives
    assert report.measured["param_bytes"] <= 150_000


def test_compile_plan_auto_asks_for_devices_and_knows_one_plan():
    with pytest.raises(ValueError, match="plan='auto' needs devices"):
        onnx2jax.compile(ZOO / "gpt2.onnx", plan="auto")
    with pytest.raises(ValueError, match="plan must be 'auto'"):
        onnx2jax.compile(ZOO / "gpt2.onnx", devices=2, plan="megatron")
    with pytest.raises(ValueError, match="goes with plan='auto'"):
        onnx2jax.compile(ZOO / "gpt2.onnx", auto=dict(batch=2))
    with pytest.raises(onnx2jax.errors.MeshShapeError, match="mesh shape"):
        onnx2jax.compile(ZOO / "gpt2.onnx", devices={"data": 3, "tensor": 3}, plan="auto",
                         auto=dict(calibrate=False))
