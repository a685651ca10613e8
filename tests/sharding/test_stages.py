"""Stage assignment: PopRT's sharding-point walk, the automatic cut, partitions and their errors.

Expected assignments are worked out by hand from PopRT's manual (points in
topological order, walk towards the inputs, stop at graph inputs and at
assigned nodes, leftovers get max + 1).
"""

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from sharding.partition import BackwardEdgeError, partition
from sharding.annotate import name_nodes
from sharding.stages import (
    METADATA_KEY,
    StageAssignment,
    annotate_stages,
    auto_stages,
    device_groups,
    load_points_yaml,
    read_stages,
    stage_devices,
    stages_from_points,
    walk_points,
    write_stages,
)

DATA = Path(__file__).resolve().parents[1] / "data"
F = onnx.TensorProto.FLOAT


def _graph(nodes, inputs=("x",), outputs=("y",), inits=()) -> onnx.GraphProto:
    return oh.make_graph(
        [oh.make_node(op, ins, outs, name=name) for name, op, ins, outs in nodes],
        "g",
        [oh.make_tensor_value_info(i, F, [2, 4]) for i in inputs],
        [oh.make_tensor_value_info(o, F, None) for o in outputs],
        [onh.from_array(np.ones((4, 4), np.float32), w) for w in inits],
    )


def _diamond() -> onnx.GraphProto:
    """x -> a -> {b1 -> c1, b2 -> c2} -> join -> out; two parallel branches."""
    return _graph(
        [
            ("a", "Relu", ["x"], ["ta"]),
            ("b1", "Neg", ["ta"], ["tb1"]),
            ("c1", "Abs", ["tb1"], ["tc1"]),
            ("b2", "Exp", ["ta"], ["tb2"]),
            ("c2", "Sin", ["tb2"], ["tc2"]),
            ("join", "Add", ["tc1", "tc2"], ["tj"]),
            ("out", "Relu", ["tj"], ["y"]),
        ]
    )


def test_walk_takes_every_unassigned_ancestor():
    # c1 first (topological order): a, b1, c1 -> 0. Then join: c2, b2, join -> 1 (a is taken).
    # Leftover: out -> max + 1 = 2.
    got = walk_points(_diamond(), {"join": 1, "c1": 0})
    assert got == {"a": 0, "b1": 0, "c1": 0, "b2": 1, "c2": 1, "join": 1, "out": 2}


def test_parallel_branches_share_a_stage_and_device():
    # Both branch points on stage 0: a goes with the first branch walked (c1 precedes c2).
    stages = stages_from_points(_diamond(), {"c1": 0, "c2": 0}, {"c1": 0, "c2": 0})
    assert stages.stage == {"a": 0, "b1": 0, "c1": 0, "b2": 0, "c2": 0, "join": 1, "out": 1}
    assert stages.group == {0: 0, 1: 1}


def test_stage_ids_need_not_be_contiguous_and_devices_are_shared():
    # Stages 0 and 5 on device 3; leftovers get device 4 and stage 6.
    got = stages_from_points(_diamond(), {"c1": 3, "join": 3}, {"c1": 0, "join": 5})
    assert got.stage == {"a": 0, "b1": 0, "c1": 0, "b2": 5, "c2": 5, "join": 5, "out": 6}
    assert got.group == {0: 3, 5: 3, 6: 4}
    assert device_groups(list(got.group.values()), 8) == {3: (0, 1, 2, 3), 4: (4, 5, 6, 7)}
    assert device_groups(list(got.group.values()), None) == {3: (0,), 4: (1,)}
    part = partition(_diamond(), got.stage)
    assert part.parts == (0, 5, 6)
    assert part.crossing == (("ta", 0, 5), ("tc1", 0, 5), ("tj", 5, 6))


def test_walk_stops_at_graph_inputs_and_initializers():
    graph = _graph(
        [("m1", "MatMul", ["x", "W"], ["h"]), ("m2", "MatMul", ["z", "W"], ["g"]), ("s", "Add", ["h", "g"], ["y"])],
        inputs=("x", "z"),
        inits=("W",),
    )
    assert walk_points(graph, {"m1": 0}) == {"m1": 0, "m2": 1, "s": 1}


def test_a_stage_on_two_devices_is_refused():
    with pytest.raises(ValueError, match="stage 0 has nodes on devices \\[0, 1\\]"):
        stages_from_points(_diamond(), {"c1": 0, "c2": 1}, {"c1": 0, "c2": 0})


def test_duplicate_names_are_listed_at_once():
    graph = _graph([("a", "Relu", ["x"], ["t1"]), ("a", "Neg", ["t1"], ["t2"]), ("b", "Abs", ["t2"], ["t3"]), ("b", "Exp", ["t3"], ["y"])])
    with pytest.raises(ValueError, match="duplicates 'a', 'b'.*--name-nodes"):
        walk_points(graph, {"a": 0})
    graph.node[1].name = ""
    with pytest.raises(ValueError, match="1 unnamed node"):
        partition(graph, {})


def test_backward_edges_are_listed():
    with pytest.raises(BackwardEdgeError) as error:
        partition(_diamond(), {"a": 0, "b1": 1, "c1": 0, "b2": 0, "c2": 0, "join": 1, "out": 1})
    assert error.value.edges == (("tb1", "b1", 1, "c1", 0),)
    assert "'tb1': b1 (stage 1) -> c1 (stage 0)" in str(error.value)
    # PopRT's walk gives one too when a later point's stage is lower.
    with pytest.raises(BackwardEdgeError, match="'tj': join \\(stage 1\\) -> out \\(stage 0\\)"):
        partition(_diamond(), walk_points(_diamond(), {"join": 1, "out": 0}))


def test_negative_stages_are_refused():
    with pytest.raises(ValueError, match="negative stages: b1=-1"):
        partition(_diamond(), {"a": 0, "b1": -1, "c1": 0, "b2": 0, "c2": 0, "join": 0, "out": 0})
    with pytest.raises(ValueError, match="negative device or stage.*c1=-2"):
        walk_points(_diamond(), {"c1": -2})
    model = oh.make_model(_diamond())
    with pytest.raises(ValueError, match="negative stages"):
        write_stages(model, {"a": -1}, {-1: (0,)}, "tp")


def test_yaml_is_poprts_list():
    text = "- node: c1\n  device: 0\n  stage: 0\n- node: join\n  device: 1\n  stage: 1\n"
    assert load_points_yaml(text) == ({"c1": 0, "join": 1}, {"c1": 0, "join": 1})
    with pytest.raises(ValueError, match="unknown keys \\['ipu'\\]"):
        load_points_yaml("- node: c1\n  ipu: 0\n")


def test_tiny_llama_yaml_points_equal_the_auto_cut():
    """One point after layer 0 gives the same two stages as auto:2; three points as auto:4."""
    model = onnx.load(DATA / "tiny_llama.onnx")
    auto2, cut2 = auto_stages(model, 2)
    assert cut2.after == ("node_add_444",) and cut2.crossing == (("add_444",),)
    points = stages_from_points(model.graph, {"node_add_444": 0}, {"node_add_444": 0})
    assert points.stage == auto2
    auto4, cut4 = auto_stages(model, 4)
    # Balanced by estimated time (the LM head's matmul and its read of the table count on the last
    # stage), the third cut comes before layer 1's MLP, not after it as by parameter bytes.
    assert cut4.after == ("node_add_394", "node_add_444", "node_add_694")
    marks = {"node_add_394": 0, "node_add_444": 1, "node_add_694": 2}
    assert stages_from_points(model.graph, marks, marks).stage == auto4
    # The cut balances parameter bytes. Stage 0 by hand: embedding 256x64, attention 64x(64+32+32+64),
    # MLP 3x64x128, two norm vectors of 64, float32; plus three float scalars its nodes read
    # (the RMSNorm exponent and epsilon, the attention scale). RoPE's inv_freq and the mask's
    # constants are read by shape-only nodes, recomputed where needed: they count nowhere.
    weights = 4 * (256 * 64 + 64 * (64 + 32 + 32 + 64) + 3 * 64 * 128 + 2 * 64)
    assert cut2.param_bytes[0] == weights + 3 * 4 == 213_516
    assert sum(cut2.param_bytes) == sum(
        onh.to_array(i).nbytes for i in model.graph.initializer
        if i.data_type == F and i.name not in ("model.model.rotary_emb.inv_freq", "zeros", "val_106")
    )
    part = partition(model.graph, auto2)
    assert part.crossing == (("add_444", 0, 1),)  # masks and RoPE tables are recomputed, not sent


def test_stages_and_devices_round_trip_through_the_model():
    model = onnx.load(DATA / "tiny_llama.onnx")
    stage_of, _ = auto_stages(model, 2)
    write_stages(model, stage_of, {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}, "pp")
    model = onnx.load_from_string(model.SerializeToString())
    assert read_stages(model, "pp") == stage_of
    assert stage_devices(model, "pp", (0, 1), 8) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert [c.num_devices for c in model.configuration] == [8]


def test_auto_refuses_more_stages_than_places():
    graph = _graph([("a", "MatMul", ["x", "W"], ["h"]), ("b", "MatMul", ["h", "V"], ["y"])], inits=("W", "V"))
    with pytest.raises(ValueError, match="only 1 place"):
        auto_stages(oh.make_model(graph), 3)


def _drop_device_map(model: onnx.ModelProto) -> None:
    keep = [p for p in model.metadata_props if not p.key.startswith(METADATA_KEY)]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)


def test_stage_devices_without_the_map_come_from_specs_or_an_even_split():
    model = onnx.load(DATA / "tiny_llama.onnx")
    stage_of, _ = auto_stages(model, 2)
    assignment = StageAssignment.one_group_per_stage(stage_of)
    tp = annotate_stages(model, assignment, 8, "pp", tensor_parallel=True)
    _drop_device_map(tp)
    assert stage_devices(tp, "pp", (0, 1), 8) == {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}  # the specs' devices
    plain = annotate_stages(model, assignment, 6, "pp")
    _drop_device_map(plain)
    assert stage_devices(plain, "pp", (0, 1), 6) == {0: (0, 1, 2), 1: (3, 4, 5)}  # an even split
    with pytest.raises(ValueError, match="do not split evenly"):
        stage_devices(plain, "pp", (0, 1), 5)


def test_check_reports_stages_and_refuses_a_backward_edge():
    from sharding.check import check

    model = onnx.load(DATA / "tiny_llama.onnx")
    stage_of, _ = auto_stages(model, 2)
    staged = annotate_stages(model, StageAssignment.one_group_per_stage(stage_of), 8, "pp", tensor_parallel=True)
    notes = [d.message for d in check(staged) if d.code == "pipeline-stage"]
    assert notes == ["stage 0: 122 nodes on devices [0, 1, 2, 3]; sends add_444", "stage 1: 68 nodes on devices [4, 5, 6, 7]"]
    assert not [d for d in check(staged) if d.severity == "error"]
    node = next(n for n in staged.graph.node if n.name == "node_embedding")
    node.device_configurations[0].pipeline_stage = 1  # the embedding after the layer that reads it
    errors = [d for d in check(staged) if d.severity == "error"]
    assert [d.code for d in errors] == ["stage-invalid"]
    assert "'embedding': node_embedding (stage 1) -> node_pow_1 (stage 0)" in errors[0].message


def test_auto_balances_estimated_time_with_the_tied_head_counted_where_it_runs():
    """GPT-2's head reuses the embedding table: by parameter bytes counted once it weighed nothing, and the
    last stage got the costliest matmul for free (8.6x imbalance at real size); by time it is charged."""
    import sys

    sys.path.insert(0, str(DATA.parents[1] / "bench"))
    import medium_transformers as mt

    config = mt.Config(layers=4, width=64, heads=4, ffn=256, vocab=8192, positions=256)
    model = mt.build("gpt2", config)
    name_nodes(model)
    stage_of, cut = auto_stages(model, 2, batch=1, sequence=128)
    transposed = {n.output[0] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] == "wte"}
    head = [n.name for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in transposed]
    assert len(head) == 1 and stage_of[head[0]] == 1
    assert cut.balance() < 1.5, cut.describe()
    assert cut.flops is not None and cut.flops[1] >= 2 * 128 * 64 * 8192  # the head's FLOPs on stage 1
    assert any(line.startswith("expected balance at batch 1 x sequence 128") for line in cut.describe())
