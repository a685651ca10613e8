"""Segmented execution around data-dependent nodes, against onnxruntime."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import onnx2jax
from onnx2jax.errors import NodeError

from onnxruntime_reference import assert_same_outputs, onnxruntime_outputs

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def _const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(array, name)


def detection_head() -> onnx.ModelProto:
    """Conv -> boxes and scores -> NonMaxSuppression -> Gather of the kept boxes -> scaled."""
    rng = np.random.default_rng(0)
    nodes = [
        oh.make_node("Conv", ["x", "w"], ["y"], name="conv"),
        oh.make_node("Reshape", ["y", "flat_shape"], ["flat"], name="flatten"),  # [1, 5, N]
        oh.make_node("Slice", ["flat", "zero", "four", "one"], ["raw_boxes"], name="box_channels"),
        oh.make_node("Transpose", ["raw_boxes"], ["boxes"], perm=[0, 2, 1], name="boxes"),  # [1, N, 4]
        oh.make_node("Slice", ["flat", "four", "five", "one"], ["logits"], name="score_channel"),
        oh.make_node("Sigmoid", ["logits"], ["scores"], name="scores"),  # [1, 1, N]
        oh.make_node(
            "NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score_min"], ["selected"], name="nms"
        ),
        oh.make_node("Gather", ["selected", "two"], ["box_index"], axis=1, name="box_index"),
        oh.make_node("Reshape", ["boxes", "box_rows"], ["box_table"], name="box_table"),
        oh.make_node("Gather", ["box_table", "box_index"], ["kept"], axis=0, name="kept_boxes"),
        oh.make_node("Mul", ["kept", "scale"], ["kept_scaled"], name="scale_boxes"),
    ]
    inits = [
        _const("w", rng.normal(size=(5, 3, 1, 1)).astype(np.float32)),
        _const("flat_shape", np.array([1, 5, -1], np.int64)),
        _const("zero", np.array([0], np.int64)),
        _const("four", np.array([4], np.int64)),
        _const("five", np.array([5], np.int64)),
        _const("one", np.array([1], np.int64)),
        _const("two", np.array(2, np.int64)),
        _const("box_rows", np.array([-1, 4], np.int64)),
        _const("max_boxes", np.array([100], np.int64)),
        _const("scale", np.array(2.0, np.float32)),
    ]
    graph = oh.make_graph(
        nodes,
        "detection_head",
        [
            oh.make_tensor_value_info("x", F, [1, 3, "h", "w"]),
            oh.make_tensor_value_info("iou", F, [1]),
            oh.make_tensor_value_info("score_min", F, [1]),
        ],
        [oh.make_tensor_value_info("selected", I64, [None, 3]), oh.make_tensor_value_info("kept_scaled", F, [None, 4])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def nonzero_model() -> onnx.ModelProto:
    """NonZero of a computed mask, then the selected values gathered and summed in a later segment."""
    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="relu"),
        oh.make_node("Greater", ["r", "t"], ["mask"], name="mask"),
        oh.make_node("NonZero", ["mask"], ["where"], name="nonzero"),
        oh.make_node("Transpose", ["where"], ["coords"], perm=[1, 0], name="coords"),
        oh.make_node("GatherND", ["r", "coords"], ["picked"], name="pick"),
        oh.make_node("ReduceSum", ["picked"], ["total"], keepdims=0, name="total"),
    ]
    graph = oh.make_graph(
        nodes,
        "nonzero",
        [oh.make_tensor_value_info("x", F, ["n", 4])],
        [oh.make_tensor_value_info("where", I64, [2, None]), oh.make_tensor_value_info("total", F, [])],
        [_const("t", np.array(0.3, np.float32))],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def _assert_same(ours, theirs) -> None:
    assert_same_outputs(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "iou, score_min, kept",
    [(0.5, 1.0, "none"), (0.3, 0.5, "some"), (1.0, -1.0, "all")],
)
def test_detection_head_equalsonnxruntime_outputs(iou: float, score_min: float, kept: str) -> None:
    proto = detection_head()
    model = onnx2jax.translate(proto)
    x = np.random.default_rng(1).normal(size=(1, 3, 4, 4)).astype(np.float32)
    feeds = {"x": x, "iou": np.array([iou], np.float32), "score_min": np.array([score_min], np.float32)}
    expected = onnxruntime_outputs(proto, feeds)
    count = {"none": 0, "all": 16}.get(kept)
    if count is None:
        assert 0 < len(expected[0]) < 16
    else:
        assert len(expected[0]) == count
    _assert_same(model(**feeds), expected)


def test_detection_head_segments_name_the_cut() -> None:
    model = onnx2jax.translate(detection_head())
    assert [s.kind for s in model.segments] == ["jit", "host", "jit"]
    host = model.segments[1]
    assert host.nodes == ("nms",) and "NonMaxSuppression" in host.reason
    assert "selected" in host.outputs and "boxes" in host.inputs


def test_nonzero_on_computed_values_equalsonnxruntime_outputs() -> None:
    proto = nonzero_model()
    model = onnx2jax.translate(proto)
    assert [s.kind for s in model.segments] == ["jit", "host", "jit"]
    x = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    _assert_same(model(x), onnxruntime_outputs(proto, {"x": x}))


def test_second_shape_signature_reuses_cached_segments() -> None:
    proto = nonzero_model()
    model = onnx2jax.translate(proto)
    rng = np.random.default_rng(3)
    small = rng.normal(size=(5, 4)).astype(np.float32)
    large = rng.normal(size=(9, 4)).astype(np.float32)
    for x in (small, large, small, rng.normal(size=(5, 4)).astype(np.float32)):
        _assert_same(model(x), onnxruntime_outputs(proto, {"x": x}))
    first = model.segment_models[0]
    # One jitted program, traced once per input shape: two shapes, two entries.
    assert list(first._jitted) == [()]
    assert first._jitted[()]._cache_size() == 2


def test_tracing_a_segmented_model_names_the_node() -> None:
    model = onnx2jax.translate(detection_head())
    x = np.zeros((1, 3, 4, 4), np.float32)
    args = (model.params, x, np.array([0.5], np.float32), np.array([0.5], np.float32))
    with jax.enable_x64(True):
        with pytest.raises(NodeError, match="'nms'.*NonMaxSuppression.*model.segments"):
            jax.jit(model.fn)(*args)
        with pytest.raises(NodeError, match="'nms'"):
            jax.grad(lambda p: model.fn(p, *args[1:])[1].sum())(model.params)


def test_compile_runs_an_unannotated_segmented_model() -> None:
    # Sharded segmented runs: test_segments_sharded.py. Without annotations, compile() runs it replicated.
    proto = detection_head()
    x = np.random.default_rng(1).normal(size=(1, 3, 4, 4)).astype(np.float32)
    feeds = {"x": x, "iou": np.array([0.3], np.float32), "score_min": np.array([0.5], np.float32)}
    _assert_same(onnx2jax.compile(proto)(**feeds), onnxruntime_outputs(proto, feeds))


def test_cli_run_lists_the_segments_and_matchesonnxruntime_outputs(tmp_path, capsys) -> None:
    from onnx2jax.cli.app import main

    path = tmp_path / "head.onnx"
    onnx.save(detection_head(), path)
    np.save(tmp_path / "iou.npy", np.array([0.3], np.float32))
    np.save(tmp_path / "score_min.npy", np.array([0.5], np.float32))
    inputs = ["--input", f"iou={tmp_path / 'iou.npy'}", "--input", f"score_min={tmp_path / 'score_min.npy'}"]
    assert main(["run", str(path), "--dim", "h=4", "--dim", "w=4", *inputs, "--check"]) == 0
    out = capsys.readouterr().out
    assert "runs in 3 segments (data-dependent output shapes); --verbose lists them" in out
    assert "host step" not in out  # quiet by default
    assert main(["run", str(path), "--dim", "h=4", "--dim", "w=4", *inputs, "--check", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "segment 2: host step 'nms': NonMaxSuppression's output length depends" in out
    for name in ("selected", "kept_scaled"):
        line = next(l for l in out.splitlines() if l.startswith(f"{name}: shape"))
        assert float(line.split("max |diff| vs onnxruntime")[1].split()[0]) < 1e-5


def test_inputs_feeding_only_a_host_step_are_not_compiled_per_value() -> None:
    # x reaches NonZero through computed values: the host step takes it, no jitted program needs its values.
    assert onnx2jax.translate(nonzero_model()).shape_input_names == set()


def test_an_initializer_as_graph_output_of_a_segmented_model() -> None:
    proto = nonzero_model()
    proto.graph.output.append(oh.make_tensor_value_info("t", F, []))
    x = np.random.default_rng(4).normal(size=(3, 4)).astype(np.float32)
    _assert_same(onnx2jax.translate(proto)(x), onnxruntime_outputs(proto, {"x": x}))


DETECTION = pathlib.Path(__file__).resolve().parents[1] / "data" / "detection"


@pytest.mark.parametrize("case, kept", [("none", 0), ("some", 22), ("all", 36)])
def test_torch_exported_detection_head_equalsonnxruntime_outputs(case: str, kept: int) -> None:
    # scripts/make_detection_fixtures.py: torch export ending in NonMaxSuppression, onnxruntime's outputs.
    model = onnx2jax.translate(DETECTION / "head.onnx")
    assert [s.kind for s in model.segments] == ["jit", "host", "jit"]
    inputs = dict(np.load(DETECTION / f"head.{case}.inputs.npz"))
    expected = np.load(DETECTION / f"head.{case}.ort_outputs.npz")
    assert len(expected["selected"]) == kept
    _assert_same(model(**inputs), [expected[name] for name in model.output_names])
