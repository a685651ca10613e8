"""Pipeline stages on 8 fake CPU devices: tiny Llama in 2 and 4 stages, alone and with TP inside.

References: onnxruntime (the stored outputs at batch 2; a batch-4 run made
here) and the unsharded onnx2jax run. Collective counts are the Megatron
minimum of each stage: one all-reduce for the vocabulary-split embedding and
one per attention and per MLP pair; the column-parallel LM head none.
"""

from pathlib import Path
from unittest import mock

import jax
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.runtime import pipeline as pipeline_module
from onnx2jax.runtime.pipeline import PipelineCompiled
from onnx2jax.runtime.pipeline_report import measure
from sharding.annotate import add_configuration, set_stage
from sharding.stages import StageAssignment, annotate_stages, auto_stages

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"

# all-reduces per stage: auto:2 cuts after layer 0 (embedding + 2 pairs | 2 pairs + head);
# auto:4 after layer 0's attention, layer 0 and layer 1 (embedding + attention | MLP | 2 pairs | head).
# auto:4 balances estimated time: its last cut falls between layer 1's attention and MLP (one all-reduce each),
# the LM head (logits left vocab-sharded) on the last stage with that MLP.
MEGATRON_ALL_REDUCES = {2: [3, 2], 4: [2, 1, 1, 1]}


def _staged(stages: int, tp: int) -> onnx.ModelProto:
    """tiny Llama cut by auto:S, on S groups of ``tp`` devices, Megatron inside each group.

    Without TP only ``pipeline_stage`` is written, as another tool would: no
    device map, so stage k of a k-device configuration runs on device k.
    """
    model = onnx.load(LLAMA)
    stage_of, _ = auto_stages(model, stages)
    if tp == 1:
        add_configuration(model, "pp", stages)
        for node, stage in stage_of.items():
            set_stage(model, node, stage, "pp")
        return model
    assignment = StageAssignment.one_group_per_stage(stage_of)
    return annotate_stages(model, assignment, stages * tp, "pp", tensor_parallel=True)


@pytest.fixture(scope="module")
def batch4() -> tuple[dict, np.ndarray]:
    """Batch-4 inputs and onnxruntime's logits for them."""
    ids = np.random.default_rng(4).integers(0, 256, (4, 16)).astype(np.int64)
    session = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, {"input_ids": ids})
    return {"input_ids": ids}, logits


@pytest.fixture(scope="module")
def unsharded(batch4) -> np.ndarray:
    (logits,) = onnx2jax.translate(str(LLAMA))(**batch4[0])
    return np.asarray(logits)


def _check_run(compiled: PipelineCompiled, batch4, unsharded, microbatches) -> None:
    inputs, reference = batch4
    for m in microbatches:
        compiled.microbatches = m
        (logits,) = compiled(**inputs)
        np.testing.assert_allclose(np.asarray(logits), reference, rtol=0, atol=1e-5)
        np.testing.assert_allclose(np.asarray(logits), unsharded, rtol=0, atol=1e-5)


def _check_placement(compiled: PipelineCompiled, stages: int, tp: int) -> None:
    """Each stage's parameters live exactly on its own devices, and its collectives are Megatron's."""
    devices = jax.devices()
    assert [s.devices for s in compiled.stages] == [tuple(range(k * tp, (k + 1) * tp)) for k in range(stages)]
    for stage in compiled.stages:
        own = {devices[d] for d in stage.devices}
        for name, array in stage.compiled.params.items():
            assert array.sharding.device_set == own, (stage.stage, name, array.sharding)
    report = compiled.report(repeats=1)
    calls = []
    with mock.patch.object(pipeline_module, "measure", side_effect=lambda *a: calls.append(a) or measure(*a)):
        assert compiled.report(repeats=1) is report and not calls  # the timings it has, nothing run again
        assert compiled.report(repeats=1, refresh=True) is not report and len(calls) == 1
    assert [r.collectives["all-reduce"] for r in report.stages] == (
        MEGATRON_ALL_REDUCES[stages] if tp > 1 else [0] * stages
    )
    assert all(sum(r.collectives.values()) == r.collectives["all-reduce"] for r in report.stages)
    # Only the residual stream crosses: [micro-batch, 16, 64] float32.
    batch = 4 // compiled.microbatches
    assert [r.sent_bytes for r in report.stages] == [batch * 16 * 64 * 4] * (stages - 1) + [0]
    assert 0 <= report.bound == (stages - 1) / (compiled.microbatches + stages - 1)


@pytest.mark.parametrize(("stages", "tp", "microbatches"), [(2, 1, (1, 4)), (4, 2, (2,)), (2, 4, (4,))])
def test_tiny_llama_pipeline(stages, tp, microbatches, batch4, unsharded):
    compiled = onnx2jax.compile(_staged(stages, tp))
    assert isinstance(compiled, PipelineCompiled) and len(compiled.stages) == stages
    _check_run(compiled, batch4, unsharded, microbatches)
    _check_placement(compiled, stages, tp)


@pytest.mark.slow
@pytest.mark.parametrize(("stages", "tp"), [(2, 1), (2, 2), (2, 4), (4, 1), (4, 2)])
def test_tiny_llama_pipeline_every_microbatch_count(stages, tp, batch4, unsharded):
    compiled = onnx2jax.compile(_staged(stages, tp))
    _check_run(compiled, batch4, unsharded, (1, 2, 4))
    _check_placement(compiled, stages, tp)


def test_stored_batch_matches_onnxruntime_through_the_cli(tmp_path: Path, capsys):
    """PopRT YAML -> annotate -> compile; the stored batch-2 inputs in two micro-batches."""
    shard = tmp_path / "shard.yaml"
    shard.write_text("- node: node_add_444\n  device: 0\n  stage: 0\n- node: node_add_744\n  device: 1\n  stage: 1\n")
    out = tmp_path / "staged.onnx"
    assert main(["annotate", str(LLAMA), "--stages", str(shard), "--devices", "6", "--plan", "megatron", "-o", str(out)]) == 0
    compiled = onnx2jax.compile(str(out), microbatches=2)
    assert [s.devices for s in compiled.stages] == [(0, 1), (2, 3), (4, 5)]  # leftovers: group 2
    inputs = dict(np.load(DATA / "tiny_llama.inputs.npz"))
    expected = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]
    (logits,) = compiled(**inputs)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=0, atol=1e-5)
    capsys.readouterr()
    assert main(["check", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "stage 0: 122 nodes on devices [0, 1]; sends add_444" in printed
    assert "stage 2: 8 nodes on devices [4, 5]" in printed and "no errors" in printed


def test_annotate_auto_prints_the_cut(tmp_path: Path, capsys):
    out = tmp_path / "auto.onnx"
    assert main(["annotate", str(LLAMA), "--stages", "auto:2", "--devices", "8", "--plan", "megatron", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "auto:2 cuts after 'node_add_444': stage 0 sends 'add_444' to stage 1" in printed
    assert "stage 1: 68 nodes on devices [4, 5, 6, 7]" in printed
    assert "expected balance at batch 1 x sequence 128: slowest/fastest stage" in printed
    # Places with the same cost on both sides are one candidate; by estimated time (activations written
    # count) fewer places tie than by parameter bytes.
    assert main(["annotate", str(LLAMA), "--stages", "auto:20", "-o", str(out)]) == 1
    assert "auto:20: only 7 place(s) in the graph where one activation crosses" in capsys.readouterr().err


def test_example_runs():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pipeline_llama", Path(__file__).resolve().parents[2] / "examples" / "pipeline_llama.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--stages", "2", "--tp", "2", "--microbatches", "2", "--batch", "4"]) < 1e-5


def test_symbolic_batch_and_sequence(batch4):
    compiled = onnx2jax.compile(_staged(2, 1), microbatches=3)
    ids = np.random.default_rng(1).integers(0, 256, (3, 7)).astype(np.int64)
    session = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"input_ids": ids})
    (logits,) = compiled(ids)
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="'input_ids' \\[4, 16\\]: its axis 0 .* microbatches=3"):
        compiled(**batch4[0])


def test_microbatches_need_stages():
    with pytest.raises(ValueError, match="microbatches=2 needs a model with pipeline stages"):
        onnx2jax.compile(str(LLAMA), microbatches=2)


@pytest.mark.slow
def test_cli_run_on_a_staged_model(tmp_path: Path, capsys):
    out = tmp_path / "auto.onnx"
    assert main(["annotate", str(LLAMA), "--stages", "auto:4", "--devices", "8", "--plan", "megatron", "-o", str(out)]) == 0
    assert main(["run", str(out), "--devices", "8", "--check", "--verbose"]) == 0
    printed = capsys.readouterr().out
    assert "pipeline: 4 stages, 1 micro-batches" in printed and "vs onnxruntime" in printed


def test_a_stage_input_with_an_uneven_spec_runs():
    """A stage input whose spec does not divide its shape (6 columns over 4 devices) moves replicated.

    JAX holds no unevenly sharded array: device_put with that spec raised
    IndivisibleError. The stage's own constraint cuts it inside its program.
    """
    from onnx import TensorProto, helper as oh

    from sharding.annotate import set_spec
    from sharding.spec import ShardingSpec
    from sharding.stages import write_stages

    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["a"], name="n0"), oh.make_node("Neg", ["a"], ["y"], name="n1")],
        "uneven",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 6])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    write_stages(model, {"n0": 0, "n1": 1}, {0: [0, 1, 2, 3], 1: [4, 5, 6, 7]}, "pp")
    set_spec(model, "n1", ShardingSpec.split("a", {1: 4}, [4, 5, 6, 7]), "pp")
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5
    compiled = onnx2jax.compile(model, microbatches=2)
    with pytest.warns(UserWarning, match="'y'.*comes back replicated"):  # its inferred spec is uneven too
        (y,) = compiled(x)
    np.testing.assert_array_equal(np.asarray(y), -np.maximum(x, 0))


def test_microbatches_on_a_fixed_batch_axis_are_refused_by_input_name():
    from onnx import TensorProto, helper as oh

    from sharding.stages import write_stages

    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["a"], name="n0"), oh.make_node("Neg", ["a"], ["y"], name="n1")],
        "fixed",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    write_stages(model, {"n0": 0, "n1": 1}, {0: [0], 1: [1]}, "pp")
    with pytest.raises(ValueError, match=r"fixed axis 0 on 'x' \[2, 6\]"):
        onnx2jax.compile(model, microbatches=2)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) - 5
    (y,) = onnx2jax.compile(model, microbatches=1)(x)
    np.testing.assert_array_equal(np.asarray(y), -np.maximum(x, 0))


def test_a_size_on_a_symbolic_axis_is_checked_at_each_call(batch4, unsharded):
    """A dim_value on the symbolic batch axis, checked at a micro-batch's shapes as Compiled checks a call's."""
    from sharding.diagnostics import ShardingError

    model = _staged(2, 2)
    spec = next(
        s for node in model.graph.node if node.name == "node_embedding"
        for config in node.device_configurations for s in config.sharding_spec if s.tensor_name == "input_ids"
    )
    spec.sharded_dim.add(axis=0, simple_sharding=[onnx.SimpleShardedDimProto(dim_value=4, num_shards=1)])
    compiled = onnx2jax.compile(model)
    _check_run(compiled, batch4, unsharded, (1,))  # the call's batch is the written 4
    ids = batch4[0]["input_ids"]
    mismatch = (r"error\[dim-value-mismatch\] node 'node_embedding' \(Gather\), tensor 'input_ids', axis 0: "
                r"dim_value is 4 but axis 0 has size 2")
    with pytest.raises(ShardingError, match=mismatch):
        compiled(ids[:2])
    compiled.microbatches = 2  # each stage runs the graph on a micro-batch of 2
    with pytest.raises(ShardingError, match=mismatch):
        compiled(ids)
    (logits,) = compiled(np.concatenate([ids, ids]))  # micro-batches of the written 4
    np.testing.assert_allclose(np.asarray(logits)[4:], batch4[1], rtol=0, atol=1e-5)


def test_cli_run_with_microbatches_equals_the_unstaged_run(tmp_path: Path, capsys):
    """``onnx2jax run --microbatches 2`` on a 2-stage model: the outputs of the unstaged run, and onnxruntime's."""
    staged = tmp_path / "staged.onnx"
    assert main(["annotate", str(LLAMA), "--stages", "auto:2", "--devices", "4", "--plan", "megatron", "-o", str(staged)]) == 0
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(5).integers(0, 256, (4, 8)).astype(np.int64))
    out = tmp_path / "out.npz"
    capsys.readouterr()
    assert main(["run", str(staged), "--devices", "4", "--microbatches", "2", "--input", f"input_ids={ids}",
                 "--check", "--output", str(out), "--verbose"]) == 0
    printed = capsys.readouterr().out
    assert "pipeline: 2 stages, 2 micro-batches" in printed and "vs onnxruntime" in printed
    assert "stages 0, 1: layers unrolled" in printed  # the stages' identical lines said once
    (unstaged,) = onnx2jax.translate(str(LLAMA))(input_ids=np.load(ids))
    np.testing.assert_allclose(np.load(out)["logits"], np.asarray(unstaged), rtol=0, atol=1e-5)
    assert main(["run", str(staged), "--devices", "4", "--microbatches", "3", "--input", f"input_ids={ids}"]) == 1
    assert "microbatches=3" in capsys.readouterr().err
    assert main(["run", str(LLAMA), "--microbatches", "2"]) == 2
    assert "--microbatches" in capsys.readouterr().err
