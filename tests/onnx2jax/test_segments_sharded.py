"""Segmented models compiled sharded on 8 fake CPU devices, against onnxruntime.

Each jitted segment is its own SPMD program; the tests count the collectives
of each segment's compiled HLO against the minimum derived by hand, check
where each segment's outputs sit with `sharding.tiles` (tests/onnx2jax/placement.py),
and read the report for the host steps.
"""

from __future__ import annotations

import io
import pathlib

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from rich.console import Console

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from onnx2jax.errors import NodeError
from onnx2jax.runtime.segmented import SegmentedCompiled
from sharding.annotate import add_configuration, set_spec
from sharding.spec import ShardingSpec
from placement import placement_problem
from onnxruntime_reference import assert_same_outputs, onnxruntime_outputs

N = 8
DEVICES = range(N)
F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64
DETECTION = pathlib.Path(__file__).resolve().parents[1] / "data" / "detection"
NONE = {"all-reduce": 0, "all-gather": 0, "all-to-all": 0, "collective-permute": 0, "reduce-scatter": 0}
ONE_ALL_REDUCE = {**NONE, "all-reduce": 1}


def _const(name: str, array: np.ndarray) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(array, name)


def _assert_same(ours, theirs) -> None:
    assert_same_outputs(ours, theirs, rtol=1e-4, atol=1e-5)


def _collectives(compiled: SegmentedCompiled, *inputs, **named) -> list:
    return [None if text is None else count_collectives(text) for text in compiled.compiled_texts(*inputs, **named)]


def _report_text(compiled: SegmentedCompiled) -> str:
    out = io.StringIO()
    compiled.report().render(Console(file=out, width=400))
    return out.getvalue()


# -- the torch-exported detection head: channel-parallel convs before NonMaxSuppression --------------


def torch_head_channel_parallel() -> onnx.ModelProto:
    """tests/data/detection/head.onnx with its conv pair split on channels (Megatron for convs).

    body Conv: output channels split 8 ways (weight and bias on axis 0); head
    Conv: input channels split 8 ways (weight axis 1), so its partial sums meet
    in one all-reduce and boxes and scores come out replicated.
    """
    model = onnx.load(DETECTION / "head.onnx")
    add_configuration(model, "tp", N)
    set_spec(model, "/body/Conv", ShardingSpec.split("body.weight", {0: N}, DEVICES), "tp")
    set_spec(model, "/body/Conv", ShardingSpec.split("body.bias", {0: N}, DEVICES), "tp")
    set_spec(model, "/head/Conv", ShardingSpec.split("head.weight", {1: N}, DEVICES), "tp")
    return model


@pytest.fixture(scope="module")
def torch_head() -> SegmentedCompiled:
    return onnx2jax.compile(torch_head_channel_parallel())


@pytest.mark.parametrize("case, kept", [("none", 0), ("some", 22), ("all", 36)])
def test_torch_head_sharded_equalsonnxruntime_outputs(torch_head, case: str, kept: int) -> None:
    assert isinstance(torch_head, SegmentedCompiled)
    assert [s.kind for s in torch_head.segments] == ["jit", "host", "jit"]
    inputs = dict(np.load(DETECTION / f"head.{case}.inputs.npz"))
    expected = np.load(DETECTION / f"head.{case}.ort_outputs.npz")  # onnxruntime's, stored by the fixture script
    assert len(expected["selected"]) == kept
    outputs = torch_head(**inputs)
    _assert_same(outputs, [expected[name] for name in torch_head.output_names])
    # Segment 1: 1 all-reduce (the row-parallel head conv); the host step none; segment 3 (gathers
    # of replicated boxes) none.
    assert _collectives(torch_head, **inputs) == [ONE_ALL_REDUCE, None, NONE]
    # Every output of every segment is replicated on the 8 devices (boxes and scores after the
    # all-reduce; the host's 'selected' re-placed replicated: its reader has no spec).
    for values in torch_head.last_outputs:
        for value in values:
            if hasattr(value, "sharding"):
                assert placement_problem(value, None) is None
    for output in outputs:
        assert placement_problem(output, None) is None


def test_torch_head_parameters_are_split(torch_head) -> None:
    per_device = torch_head.report(**dict(np.load(DETECTION / "head.some.inputs.npz"))).steps[0].report
    whole = 4 * (8 * 3 * 3 * 3 + 8 + 5 * 8 * 1 * 1)  # the split weights and bias; head.bias (5) stays whole
    assert set(per_device.param_bytes_per_device.values()) == {whole // N + 4 * 5}


def test_report_names_the_host_steps_and_the_moves(torch_head) -> None:
    torch_head(**dict(np.load(DETECTION / "head.some.inputs.npz")))
    text = _report_text(torch_head)
    assert "segmented run: 3 segments on mesh {'d0': 8}" in text
    assert "segment 2: host step '/NonMaxSuppression' (NonMaxSuppression): output 'selected' has a data-dependent length" in text
    # The host gathers boxes [1, 36, 4] float32 and scores [1, 1, 36] float32 from segment 1.
    assert "gather '/Transpose_output_0' [1, 36, 4] float32 (576 bytes) from segment 1" in text
    assert "gather '/Sigmoid_output_0' [1, 1, 36] float32 (144 bytes) from segment 1" in text
    # 22 kept boxes: 22 x 3 int64 = 528 bytes back onto the mesh, replicated (no reader has a spec).
    assert "re-place 'selected' [22, 3] int64 (528 bytes) from host step 2 onto the mesh as P()" in text
    assert "receive '/Transpose_output_0' [1, 36, 4] float32 (576 bytes) from segment 1 as placed" in text
    assert "output 'selected' [22, 3] int64 (528 bytes) from host step 2: returned replicated" in text
    assert "segment 1: jitted program, 26 node(s); collectives: all-reduce 1" in text


def test_cli_run_devices_8_on_a_segmented_model(tmp_path, capsys) -> None:
    from onnx2jax.cli.app import main

    path = tmp_path / "head_tp.onnx"
    onnx.save(torch_head_channel_parallel(), path)
    code = main(["run", str(path), "--devices", "8", "--input", str(DETECTION / "head.some.inputs.npz"), "--check", "--verbose"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "segment 2: host step '/NonMaxSuppression' (NonMaxSuppression)" in out
    assert "re-place 'selected' [22, 3] int64" in out
    for name in ("selected", "kept_boxes"):
        line = next(l for l in out.splitlines() if l.startswith(f"{name}: shape"))
        assert float(line.split("max |diff| vs onnxruntime")[1].split()[0]) < 1e-5


# -- an onnx.helper-built head: a Megatron Linear pair before NonMaxSuppression ---------------------


def linear_head() -> onnx.ModelProto:
    """features [1, P, 16] -> Linear 16->32 (column) -> Relu -> Linear 32->5 (row) -> boxes, scores -> NMS."""
    rng = np.random.default_rng(5)
    nodes = [
        oh.make_node("MatMul", ["features", "w1"], ["hidden"], name="up"),
        oh.make_node("Relu", ["hidden"], ["act"], name="act"),
        oh.make_node("MatMul", ["act", "w2"], ["raw"], name="down"),  # [1, P, 5]
        oh.make_node("Slice", ["raw", "zero", "four", "two"], ["boxes"], name="boxes"),  # [1, P, 4]
        oh.make_node("Slice", ["raw", "four", "five", "two"], ["logit"], name="logit"),  # [1, P, 1]
        oh.make_node("Sigmoid", ["logit"], ["prob"], name="prob"),
        oh.make_node("Transpose", ["prob"], ["scores"], perm=[0, 2, 1], name="scores"),  # [1, 1, P]
        oh.make_node("NonMaxSuppression", ["boxes", "scores", "max_boxes", "iou", "score_min"], ["selected"], name="nms"),
        oh.make_node("Gather", ["selected", "col"], ["box_index"], axis=1, name="box_index"),
        oh.make_node("Squeeze", ["boxes", "zero"], ["box_table"], name="box_table"),  # [P, 4]
        oh.make_node("Gather", ["box_table", "box_index"], ["kept"], axis=0, name="kept"),
    ]
    inits = [
        _const("w1", rng.normal(size=(16, 32)).astype(np.float32) * 0.4),
        _const("w2", rng.normal(size=(32, 5)).astype(np.float32) * 0.4),
        _const("zero", np.array([0], np.int64)),
        _const("four", np.array([4], np.int64)),
        _const("five", np.array([5], np.int64)),
        _const("two", np.array([2], np.int64)),
        _const("col", np.array(2, np.int64)),
        _const("max_boxes", np.array([100], np.int64)),
    ]
    graph = oh.make_graph(
        nodes,
        "linear_head",
        [
            oh.make_tensor_value_info("features", F, [1, "p", 16]),
            oh.make_tensor_value_info("iou", F, [1]),
            oh.make_tensor_value_info("score_min", F, [1]),
        ],
        [oh.make_tensor_value_info("kept", F, [None, 4])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    add_configuration(model, "tp", N)
    set_spec(model, "up", ShardingSpec.split("w1", {1: N}, DEVICES), "tp")
    set_spec(model, "down", ShardingSpec.split("w2", {0: N}, DEVICES), "tp")
    return model


@pytest.mark.parametrize("iou, score_min, kept", [(0.5, 1.0, "none"), (0.3, 0.5, "some"), (1.0, -1.0, "all")])
def test_linear_head_sharded_equalsonnxruntime_outputs(iou: float, score_min: float, kept: str) -> None:
    proto = linear_head()
    compiled = onnx2jax.compile(proto)
    features = np.random.default_rng(6).normal(size=(1, 24, 16)).astype(np.float32)
    feeds = {"features": features, "iou": np.array([iou], np.float32), "score_min": np.array([score_min], np.float32)}
    expected = onnxruntime_outputs(proto, feeds)
    count = {"none": 0, "all": 24}.get(kept)
    if count is None:
        assert 0 < len(expected[0]) < 24
    else:
        assert len(expected[0]) == count
    (kept_boxes,) = compiled(**feeds)
    _assert_same([kept_boxes], expected)
    # The Megatron pair: one all-reduce in segment 1, nothing else anywhere.
    assert _collectives(compiled, **feeds) == [ONE_ALL_REDUCE, None, NONE]
    assert placement_problem(kept_boxes, None) is None


# -- NonZero in the middle, a sharded MatMul after it -------------------------------------------------


def nonzero_then_matmul() -> onnx.ModelProto:
    """x @ w0 (column) -> rows whose sum > 0 (NonZero) -> those rows of h @ w2 (row-parallel).

    h = x @ w0 [n, 32] is split on its columns; its row sums (a reduction over
    the split axis) decide which rows NonZero keeps; the kept rows of h (read
    by the last segment where segment 1 left them) go through a row-parallel
    MatMul.
    """
    rng = np.random.default_rng(7)
    nodes = [
        oh.make_node("MatMul", ["x", "w0"], ["h"], name="column"),
        oh.make_node("ReduceSum", ["h", "axis1"], ["row_sum"], keepdims=0, name="row_sum"),
        oh.make_node("Greater", ["row_sum", "zero_f"], ["mask"], name="mask"),
        oh.make_node("NonZero", ["mask"], ["nz"], name="nonzero"),  # [1, k]
        oh.make_node("Squeeze", ["nz", "axis0"], ["rows"], name="rows"),  # [k]
        oh.make_node("Gather", ["h", "rows"], ["picked"], axis=0, name="picked"),  # [k, 32]
        oh.make_node("MatMul", ["picked", "w2"], ["y"], name="row"),  # [k, 8]
    ]
    inits = [
        _const("w0", rng.normal(size=(16, 32)).astype(np.float32) * 0.3),
        _const("w2", rng.normal(size=(32, 8)).astype(np.float32) * 0.3),
        _const("axis1", np.array([1], np.int64)),
        _const("axis0", np.array([0], np.int64)),
        _const("zero_f", np.array(0.0, np.float32)),
    ]
    graph = oh.make_graph(
        nodes,
        "nonzero_then_matmul",
        [oh.make_tensor_value_info("x", F, ["n", 16])],
        [oh.make_tensor_value_info("y", F, [None, 8])],
        inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    add_configuration(model, "tp", N)
    set_spec(model, "column", ShardingSpec.split("w0", {1: N}, DEVICES), "tp")
    set_spec(model, "row", ShardingSpec.split("w2", {0: N}, DEVICES), "tp")
    return model


def test_nonzero_in_the_middle_with_a_sharded_matmul_after() -> None:
    proto = nonzero_then_matmul()
    compiled = onnx2jax.compile(proto)
    assert [s.kind for s in compiled.segments] == ["jit", "host", "jit"]
    x = np.random.default_rng(8).normal(size=(12, 16)).astype(np.float32)
    (y,) = compiled(x)
    (expected,) = onnxruntime_outputs(proto, {"x": x})
    assert 0 < len(expected) < 12
    _assert_same([y], [expected])
    # Segment 1: the row sums reduce over h's split columns: 1 all-reduce. Segment 3: the kept rows
    # of h arrive split on columns as segment 1 left them (no collective), and the row-parallel
    # MatMul's partial sums meet in 1 all-reduce.
    assert _collectives(compiled, x) == [ONE_ALL_REDUCE, None, ONE_ALL_REDUCE]
    assert compiled.report().collectives == {**NONE, "all-reduce": 2}
    h, row_sum_mask = (dict(zip(compiled.segments[0].outputs, compiled.last_outputs[0]))[n] for n in ("h", "mask"))
    assert placement_problem(h, ShardingSpec.split("h", {1: N}, DEVICES)) is None
    assert placement_problem(row_sum_mask, None) is None
    assert placement_problem(y, None) is None
    text = _report_text(compiled)
    assert "segment 2: host step 'nonzero' (NonZero): output 'nz' has a data-dependent length" in text
    assert "gather 'mask' [12] bool (12 bytes) from segment 1" in text
    assert f"re-place 'nz' [1, {len(expected)}] int64" in text
    assert "receive 'h' [12, 32] float32 (1,536 bytes) from segment 1 as placed, P(None, 'd0'): no transfer" in text


def nonzero_of_a_split_tensor() -> onnx.ModelProto:
    """x @ w0 (column-parallel) -> h > 0 -> NonZero: the host step reads a tensor split over the devices."""
    w0 = np.random.default_rng(12).normal(size=(16, 32)).astype(np.float32)
    nodes = [
        oh.make_node("MatMul", ["x", "w0"], ["h"], name="column"),
        oh.make_node("Greater", ["h", "zero_f"], ["mask"], name="mask"),  # [n, 32], split on columns
        oh.make_node("NonZero", ["mask"], ["where"], name="nonzero"),  # [2, k]
    ]
    graph = oh.make_graph(
        nodes,
        "nonzero_of_a_split_tensor",
        [oh.make_tensor_value_info("x", F, ["n", 16])],
        [oh.make_tensor_value_info("where", I64, [2, None])],
        [_const("w0", w0), _const("zero_f", np.array(0.0, np.float32))],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    add_configuration(model, "tp", N)
    set_spec(model, "column", ShardingSpec.split("w0", {1: N}, DEVICES), "tp")
    return model


def test_a_host_step_gathers_a_split_tensor() -> None:
    proto = nonzero_of_a_split_tensor()
    compiled = onnx2jax.compile(proto)
    x = np.random.default_rng(13).normal(size=(4, 16)).astype(np.float32)
    (where,) = compiled(x)
    _assert_same([where], onnxruntime_outputs(proto, {"x": x}))
    (mask,) = compiled.last_outputs[0]
    assert placement_problem(mask, ShardingSpec.split("mask", {1: N}, DEVICES)) is None  # split on the devices
    assert _collectives(compiled, x) == [NONE, None]  # the column-parallel MatMul and Greater: local
    assert "gather 'mask' [4, 32] bool (128 bytes) from segment 1 (P(None, 'd0')) to the host" in _report_text(compiled)


def test_each_segment_compiles_once_per_shape_signature() -> None:
    proto = nonzero_then_matmul()
    compiled = onnx2jax.compile(proto)
    rng = np.random.default_rng(9)
    first = rng.normal(size=(12, 16)).astype(np.float32)
    calls = [first, rng.normal(size=(12, 16)).astype(np.float32), first]
    kept = set()
    for x in calls:
        (y,) = compiled(x)
        _assert_same([y], onnxruntime_outputs(proto, {"x": x}))
        kept.add(len(y))
    assert len(kept) == 2  # the two inputs keep different numbers of rows
    assert len(compiled.programs[0]._jitted) == 1  # segment 1: one input shape
    assert len(compiled.programs[2]._jitted) == 2  # segment 3: one program per kept-row count


def test_a_segmented_model_is_not_one_program() -> None:
    compiled = onnx2jax.compile(nonzero_then_matmul())
    with pytest.raises(NodeError, match="'nonzero'.*NonZero.*compiled_texts"):
        compiled.compiled_text(np.zeros((3, 16), np.float32))


def test_explain_lists_the_segments_cuts_and_crossings(tmp_path, capsys) -> None:
    from onnx2jax.cli.app import main

    path = tmp_path / "head_tp.onnx"
    onnx.save(torch_head_channel_parallel(), path)
    assert main(["explain", str(path), "--input-shape", "x=1,3,6,6"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich folds long lines
    assert "runs in 3 segments (data-dependent output shapes)" in out
    assert "segment 2: host step '/NonMaxSuppression' (NonMaxSuppression): output 'selected' has a data-dependent length" in out
    assert "gather '/Transpose_output_0' [1, 36, 4] float32 (576 B) from segment 1" in out
    assert "re-place 'selected' ['k', 3] int64 (24 B x k) from host step 2 onto the mesh as unsharded" in out
    assert "receive '/Transpose_output_0' [1, 36, 4] float32 (576 B) from segment 1 as placed" in out
    path = tmp_path / "nonzero_tp.onnx"
    onnx.save(nonzero_then_matmul(), path)
    assert main(["explain", str(path), "--json"]) == 0
    import json

    segments = json.loads(capsys.readouterr().out)["segments"]
    assert any("receive 'h' ['n', 32] float32 (128 B x n) from segment 1 as placed, 1:8 @ [0,1,2,3,4,5,6,7]" in l for l in segments)


def test_a_host_output_whose_reader_spec_does_not_divide_it_is_re_placed_replicated_and_said() -> None:
    proto = nonzero_then_matmul()
    # The Squeeze reading NonZero's [1, k] output asks for its k axis split 8 ways (and gives its
    # output replicated, which the Gather of h's split columns needs).
    set_spec(proto, "rows", ShardingSpec.split("nz", {1: N}, DEVICES), "tp")
    set_spec(proto, "rows", ShardingSpec.replicated("rows", DEVICES), "tp")
    compiled = onnx2jax.compile(proto)
    rng = np.random.default_rng(10)
    for _ in range(4):
        x = rng.normal(size=(12, 16)).astype(np.float32)
        (y,) = compiled(x)
        (expected,) = onnxruntime_outputs(proto, {"x": x})
        _assert_same([y], [expected])
        if len(expected) % N:
            break
    assert len(expected) % N  # k does not divide by 8: JAX cannot hold it split
    (move,) = [m for m in compiled.moves if m.kind == "re-place"]
    assert move.tensor == "nz" and move.reader == "rows"
    assert move.sharding == "P(), replicated: its reader's spec does not divide the shape (cut inside the program)"
    assert placement_problem(compiled.last_outputs[2][0], None) is None


def _rows_kept(count: int, total: int) -> np.ndarray:
    """x [total, 16] whose rows of x @ w0 sum to > 0 exactly for the first ``count`` rows."""
    w0 = onnx.numpy_helper.to_array(next(i for i in nonzero_then_matmul().graph.initializer if i.name == "w0"))
    direction = w0.sum(axis=1)  # row_sum(x @ w0) = x . direction
    signs = np.where(np.arange(total) < count, 1.0, -1.0)[:, None]
    noise = np.random.default_rng(11).uniform(0.5, 1.5, size=(total, 1))
    return (signs * noise * direction[None, :]).astype(np.float32)


def test_a_host_output_is_re_placed_with_its_first_readers_spec() -> None:
    proto = nonzero_then_matmul()
    set_spec(proto, "rows", ShardingSpec.split("nz", {1: N}, DEVICES), "tp")
    set_spec(proto, "rows", ShardingSpec.replicated("rows", DEVICES), "tp")
    compiled = onnx2jax.compile(proto)
    x = _rows_kept(N, 12)  # 8 kept rows: NonZero's [1, 8] output divides 8 ways
    (y,) = compiled(x)
    (expected,) = onnxruntime_outputs(proto, {"x": x})
    assert len(expected) == N
    _assert_same([y], [expected])
    (move,) = [m for m in compiled.moves if m.kind == "re-place"]
    assert (move.tensor, move.reader, move.shape, move.sharding) == ("nz", "rows", (1, N), "P(None, 'd0')")
    placed = next(v for v in compiled.segment_inputs[2].values() if getattr(v, "shape", None) == (1, N))
    assert placement_problem(placed, ShardingSpec.split("nz", {1: N}, DEVICES)) is None


def test_a_user_mesh_with_explicit_axes() -> None:
    import jax

    mesh = jax.make_mesh((N,), ("model",))
    compiled = onnx2jax.compile(torch_head_channel_parallel(), mesh)
    inputs = dict(np.load(DETECTION / "head.some.inputs.npz"))
    expected = np.load(DETECTION / "head.some.ort_outputs.npz")
    outputs = compiled(**inputs)
    _assert_same(outputs, [expected[name] for name in compiled.output_names])
    assert compiled.mesh.axis_names == ("model",)
    for output in outputs:
        assert output.sharding.mesh.axis_names == ("model",) and placement_problem(output, None) is None


def test_specs_written_on_a_host_node_are_said_not_to_apply() -> None:
    proto = linear_head()
    set_spec(proto, "nms", ShardingSpec.replicated("boxes", DEVICES), "tp")
    compiled = onnx2jax.compile(proto)
    feeds = {
        "features": np.random.default_rng(6).normal(size=(1, 24, 16)).astype(np.float32),
        "iou": np.array([0.3], np.float32),
        "score_min": np.array([0.5], np.float32),
    }
    _assert_same(compiled(**feeds), onnxruntime_outputs(proto, feeds))
    assert "its specs written for 'boxes' do not apply: the node runs on the host" in _report_text(compiled)


@pytest.mark.parametrize("iou, score_min, kept", [(0.5, 1.0, 0), (0.3, 0.5, None), (1.0, -1.0, 16)])
def test_helper_head_with_an_uneven_conv_split(iou: float, score_min: float, kept: int | None) -> None:
    from test_segments import detection_head  # Conv -> boxes and scores -> NonMaxSuppression -> Gather

    proto = detection_head()
    add_configuration(proto, "tp", N)
    # 5 output channels split 8 ways (GSPMD blocks of 1: devices 5-7 hold none).
    set_spec(proto, "conv", ShardingSpec.split("w", {0: N}, DEVICES), "tp")
    compiled = onnx2jax.compile(proto)
    x = np.random.default_rng(1).normal(size=(1, 3, 4, 4)).astype(np.float32)
    feeds = {"x": x, "iou": np.array([iou], np.float32), "score_min": np.array([score_min], np.float32)}
    expected = onnxruntime_outputs(proto, feeds)
    if kept is None:
        assert 0 < len(expected[0]) < 16
    else:
        assert len(expected[0]) == kept
    _assert_same(compiled(**feeds), expected)
    # The box channels 0:4 straddle the channel shards: the conv output is gathered once before the
    # two channel Slices (one all-gather, shared); nothing else moves.
    assert _collectives(compiled, **feeds) == [{**NONE, "all-gather": 1}, None, NONE]


@pytest.mark.slow
def test_two_processes_of_four_devices(tmp_path) -> None:
    # The gather spans processes (process_allgather); each process runs NonMaxSuppression on the same value.
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{s.getsockname()[1]}"
    script = pathlib.Path(__file__).resolve().parent / "multihost_segmented.py"
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    out = tmp_path / "outputs.npz"
    processes = []
    try:
        for rank in range(2):
            argv = [sys.executable, str(script), "--coordinator", coordinator, "--process-id", str(rank)]
            argv += ["--output", str(out)] if rank == 0 else []
            processes.append(subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.STDOUT, text=True))
        logs = [p.communicate(timeout=300)[0] for p in processes]
    finally:
        for p in processes:  # a process left waiting for its peer would hang around
            if p.poll() is None:
                p.kill()
                p.wait()
    for rank, (p, log) in enumerate(zip(processes, logs)):
        assert p.returncode == 0, f"process {rank}:\n{log[-3000:]}"
        assert f"process {rank}: ['jit', 'host', 'jit'] over 8 devices, 22 boxes kept" in log
    expected = np.load(DETECTION / "head.some.ort_outputs.npz")
    got = np.load(out)
    for name in ("selected", "kept_boxes"):
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    x = np.random.default_rng(13).normal(size=(4, 16)).astype(np.float32)  # as the script draws it
    (where,) = onnxruntime_outputs(nonzero_of_a_split_tensor(), {"x": x})
    np.testing.assert_array_equal(got["where"], where)


def test_graph_outputs_no_jitted_segment_returns_come_back_replicated() -> None:
    proto = nonzero_then_matmul()
    proto.graph.output.extend([oh.make_tensor_value_info(n, F, None) for n in ("w2", "zero_f")])
    proto.graph.output.append(oh.make_tensor_value_info("nz", I64, [1, None]))
    compiled = onnx2jax.compile(proto)
    x = np.random.default_rng(14).normal(size=(6, 16)).astype(np.float32)
    outputs = compiled(x)
    _assert_same(outputs, onnxruntime_outputs(proto, {"x": x}))
    for output in outputs[1:]:
        assert placement_problem(output, None) is None
    text = _report_text(compiled)
    assert "output 'w2' [32, 8] float32 (1,024 bytes) from a graph input or initializer: returned replicated" in text
    assert "output 'nz' [1, " in text and "from host step 2: returned replicated on the mesh" in text


def test_a_conflict_after_the_host_step_is_refused_by_compile_and_check_alike(tmp_path, capsys) -> None:
    from onnx2jax.cli.app import main
    from sharding import ShardingError

    proto = nonzero_then_matmul()
    # The row-parallel MatMul's K: 4 shards of 'picked' against 8 of 'w2'.
    set_spec(proto, "row", ShardingSpec.split("picked", {1: 4}, range(4)), "tp")
    with pytest.raises(ShardingError) as caught:
        onnx2jax.compile(proto)
    assert ("k-sharding-mismatch", "row") in [(d.code, d.node) for d in caught.value.diagnostics]
    path = tmp_path / "bad.onnx"
    onnx.save(proto, path)
    assert main(["check", str(path)]) == 1
    assert "k-sharding-mismatch" in capsys.readouterr().out
