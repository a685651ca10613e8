"""sharding.annotate and sharding.megatron: builders on onnx.helper graphs, the Megatron plan on the torch fixtures."""

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from sharding.annotate import add_configuration, annotate_tensor, describe_plan, name_nodes, set_spec, set_specs, set_stage
from sharding.megatron import megatron_layout, megatron_plan
from sharding.megatron.plan import write_megatron_plan
from sharding.model_configs import read_model_configs
from sharding.spec import ShardingSpec
from sharding.text import format_spec, parse_spec
from sharding.tiles import split
from sharding.validate import validate_model

DATA = Path(__file__).resolve().parents[1] / "data"
FLOAT = onnx.TensorProto.FLOAT
ALL8 = "[0,1,2,3,4,5,6,7]"
REPL8 = "replicated @ [{0,1,2,3,4,5,6,7}]"


def _mlp() -> onnx.ModelProto:
    """x -> MatMul(W1) -> Relu -> MatMul(W2) -> y, with named nodes."""
    rng = np.random.default_rng(0)
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "W1"], ["h"], name="mm1"),
            oh.make_node("Relu", ["h"], ["r"], name="relu"),
            oh.make_node("MatMul", ["r", "W2"], ["y"], name="mm2"),
            oh.make_node("MatMul", ["x", "W3"], ["z"], name="mm3"),
        ],
        "mlp",
        [oh.make_tensor_value_info("x", FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", FLOAT, [2, 4]), oh.make_tensor_value_info("z", FLOAT, [2, 8])],
        [
            onh.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W1"),
            onh.from_array(rng.standard_normal((8, 4)).astype(np.float32), "W2"),
            onh.from_array(rng.standard_normal((4, 8)).astype(np.float32), "W3"),
        ],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _written(model: onnx.ModelProto, config: str = "tp") -> dict[tuple[str, str], str]:
    """{(node, tensor): spec text} as sharding's reader sees the model."""
    return {
        (node, spec.tensor_name): format_spec(spec)
        for node, nc in read_model_configs(model).get(config, {}).items()
        for spec in nc.specs
    }


# --------------------------------------------------------------------- builders


def test_add_configuration_adds_once_and_checks_devices():
    model = _mlp()
    assert add_configuration(model, "tp", 2) == "tp"
    assert add_configuration(model, "tp", 2) == "tp"
    assert [(c.name, c.num_devices) for c in model.configuration] == [("tp", 2)]
    with pytest.raises(ValueError, match="already exists with 2 devices, not 4"):
        add_configuration(model, "tp", 4)
    with pytest.raises(ValueError, match="num_devices must be an int >= 1"):
        add_configuration(model, "x", 0)


def test_set_spec_round_trips_through_the_reader():
    model = _mlp()
    add_configuration(model, "tp", 2)
    w1 = ShardingSpec.split("W1", {1: 2}, [0, 1])
    h = parse_spec("-1:2 @ [0,1]", "h")
    set_spec(model, "mm1", w1)
    set_spec(model, "mm1", h)
    configs = read_model_configs(model)
    assert configs["tp"]["mm1"].specs == (w1, h)
    # Replacing keeps one spec per tensor, in place.
    replicated = ShardingSpec.replicated("W1", [0, 1])
    set_spec(model, "mm1", replicated, "tp")
    assert read_model_configs(model)["tp"]["mm1"].specs == (replicated, h)
    assert validate_model(model) == []


def test_set_spec_errors_are_clear():
    model = _mlp()
    spec = ShardingSpec.split("W1", {1: 2}, [0, 1])
    with pytest.raises(ValueError, match="no configuration; name one"):
        set_spec(model, "mm1", spec)
    add_configuration(model, "tp", 2)
    add_configuration(model, "pp", 2)
    with pytest.raises(ValueError, match=r"configurations \['tp', 'pp'\]; name one"):
        set_spec(model, "mm1", spec)
    with pytest.raises(ValueError, match="configuration 'dp' is not in the model"):
        set_spec(model, "mm1", spec, "dp")
    with pytest.raises(ValueError, match="tensor 'W1' is not an input or output of node 'mm2'"):
        set_spec(model, "mm2", spec, "tp")
    with pytest.raises(ValueError, match="no node named 'nope'"):
        set_spec(model, "nope", spec, "tp")
    with pytest.raises(ValueError, match=r"uses devices \[2\], but configuration 'tp' has 2"):
        set_spec(model, "mm1", ShardingSpec.split("W1", {1: 3}, [0, 1, 2]), "tp")
    model.graph.node[1].name = "mm1"
    with pytest.raises(ValueError, match="2 nodes are named 'mm1'"):
        set_spec(model, "mm1", spec, "tp")


def test_set_specs_errors_are_set_specs():
    model = _mlp()
    add_configuration(model, "tp", 2)
    spec = ShardingSpec.split("W1", {1: 2}, [0, 1])
    with pytest.raises(ValueError, match="no node named 'nope'"):
        set_specs(model, [("mm1", spec), ("nope", spec)], "tp")
    with pytest.raises(ValueError, match="tensor 'W1' is not an input or output of node 'mm2'"):
        set_specs(model, [("mm2", spec)], "tp")
    model.graph.node[1].name = "mm1"
    with pytest.raises(ValueError, match="2 nodes are named 'mm1'"):
        set_specs(model, [("mm1", spec)], "tp")


def test_set_stage_writes_pipeline_stage_next_to_specs():
    model = _mlp()
    add_configuration(model, "pp", 2)
    set_spec(model, "mm1", ShardingSpec.replicated("W1", [0]))
    set_stage(model, "mm1", 0)
    set_stage(model, "mm2", 1, "pp")
    configs = read_model_configs(model)["pp"]
    assert configs["mm1"].pipeline_stage == 0
    assert configs["mm1"].specs == (ShardingSpec.replicated("W1", [0]),)
    assert configs["mm2"].pipeline_stage == 1 and configs["mm2"].specs == ()
    with pytest.raises(ValueError, match="stage must be an int >= 0"):
        set_stage(model, "mm1", -1)
    rows = describe_plan(model)
    assert [(r.node, r.tensor, r.spec, r.stage) for r in rows] == [
        ("mm1", "W1", "replicated @ [0]", 0),
        ("mm2", "", "", 1),
    ]


def test_annotate_tensor_uses_producer_or_every_reader():
    model = _mlp()
    add_configuration(model, "tp", 2)
    # A node output: on its producer.
    assert annotate_tensor(model, "h", parse_spec("1:2 @ [0,1]")) == ["mm1"]
    # A model input read by two nodes: on both.
    assert annotate_tensor(model, "x", parse_spec("replicated @ [{0,1}]")) == ["mm1", "mm3"]
    # An initializer.
    assert annotate_tensor(model, "W2", parse_spec("0:2 @ [0,1]", "W2")) == ["mm2"]
    assert _written(model) == {
        ("mm1", "h"): "1:2 @ [0,1]",
        ("mm1", "x"): "replicated @ [{0,1}]",
        ("mm3", "x"): "replicated @ [{0,1}]",
        ("mm2", "W2"): "0:2 @ [0,1]",
    }
    with pytest.raises(ValueError, match="spec is for 'W2', not 'W1'"):
        annotate_tensor(model, "W1", parse_spec("0:2 @ [0,1]", "W2"))
    with pytest.raises(ValueError, match="'ghost' is not a node output, model input or initializer"):
        annotate_tensor(model, "ghost", parse_spec("0:2 @ [0,1]"))
    assert validate_model(model) == []


# ------------------------------------------------------------ synthetic patterns


def _gated_mlp(fused: bool) -> onnx.ModelProto:
    """RMSNorm (decomposed) -> SiLU-gated MLP -> residual; gate/up fused or not;
    the down weight stored [H, F] and transposed, as torch may export it."""
    H, F = 8, 16
    rng = np.random.default_rng(1)
    inits = [
        onh.from_array(np.array([-1], np.int64), "axes"),
        onh.from_array(np.array(1e-6, np.float32), "eps"),
        onh.from_array(rng.standard_normal((F, H)).astype(np.float32).T.copy(), "W_down_t"),
    ]
    nodes = [
        oh.make_node("Mul", ["x", "x"], ["sq"], name="sq"),
        oh.make_node("ReduceMean", ["sq", "axes"], ["ms"], name="mean"),
        oh.make_node("Add", ["ms", "eps"], ["mse"], name="add_eps"),
        oh.make_node("Sqrt", ["mse"], ["rms"], name="sqrt"),
        oh.make_node("Reciprocal", ["rms"], ["inv"], name="inv"),
        oh.make_node("Mul", ["x", "inv"], ["normed"], name="norm"),
    ]
    if fused:
        inits.append(onh.from_array(rng.standard_normal((H, 2 * F)).astype(np.float32), "W_gu"))
        nodes += [
            oh.make_node("MatMul", ["normed", "W_gu"], ["gu"], name="gate_up"),
            oh.make_node("Split", ["gu"], ["g", "u"], name="split", axis=-1, num_outputs=2),
        ]
    else:
        inits += [
            onh.from_array(rng.standard_normal((H, F)).astype(np.float32), "W_g"),
            onh.from_array(rng.standard_normal((H, F)).astype(np.float32), "W_u"),
        ]
        nodes += [
            oh.make_node("MatMul", ["normed", "W_g"], ["g"], name="gate"),
            oh.make_node("MatMul", ["normed", "W_u"], ["u"], name="up"),
        ]
    nodes += [
        oh.make_node("Sigmoid", ["g"], ["sig"], name="sig"),
        oh.make_node("Mul", ["g", "sig"], ["silu"], name="silu"),
        oh.make_node("Mul", ["silu", "u"], ["prod"], name="prod"),
        oh.make_node("Transpose", ["W_down_t"], ["W_down"], name="t_down", perm=[1, 0]),
        oh.make_node("MatMul", ["prod", "W_down"], ["down"], name="down"),
        oh.make_node("Add", ["x", "down"], ["y"], name="residual"),
        oh.make_node("Mul", ["y", "y"], ["sq2"], name="sq2"),
        oh.make_node("ReduceMean", ["sq2", "axes"], ["ms2"], name="mean2"),
        oh.make_node("Add", ["ms2", "eps"], ["mse2"], name="add_eps2"),
        oh.make_node("Sqrt", ["mse2"], ["rms2"], name="sqrt2"),
        oh.make_node("Reciprocal", ["rms2"], ["inv2"], name="inv2"),
        oh.make_node("Mul", ["y", "inv2"], ["out"], name="norm2"),
    ]
    graph = oh.make_graph(
        nodes,
        "gated_mlp",
        [oh.make_tensor_value_info("x", FLOAT, [2, 3, H])],
        [oh.make_tensor_value_info("out", FLOAT, [2, 3, H])],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_separate_gate_and_up_are_both_column_parallel():
    model = megatron_plan(_gated_mlp(fused=False), 8)
    written = _written(model)
    assert written[("gate", "W_g")] == written[("up", "W_u")] == f"1:8 @ {ALL8}"
    assert written[("gate", "g")] == f"-1:8 @ {ALL8}"
    assert written[("down", "prod")] == f"-1:8 @ {ALL8}"
    assert written[("down", "W_down")] == f"0:8 @ {ALL8}"
    # The parameter behind the Transpose is [H, F]: its F axis (1) is cut.
    assert written[("t_down", "W_down_t")] == f"1:8 @ {ALL8}"
    assert written[("down", "down")] == REPL8
    layout = megatron_layout(model, 8)
    assert [(p.kind, p.columns, p.row) for p in layout.pairs] == [("mlp", ("gate", "up"), "down")]
    assert validate_model(model) == []


def test_fused_gate_up_is_split_through_a_fused_axis():
    model = megatron_plan(_gated_mlp(fused=True), 8)
    written = _written(model)
    assert written[("gate_up", "W_gu")] == f"1:(2x1,16x8) @ {ALL8}"
    assert written[("gate_up", "gu")] == f"-1:(2x1,16x8) @ {ALL8}"
    # Device d holds columns [2d, 2d+2) of the gate and of the up half (nanotron's
    # contiguous_chunks=(F, F)).
    w = onh.to_array(next(i for i in model.graph.initializer if i.name == "W_gu"))
    spec = parse_spec(written[("gate_up", "W_gu")], "W_gu")
    shards = split(w, spec)
    for d in range(8):
        np.testing.assert_array_equal(shards[d], np.concatenate([w[:, 2 * d : 2 * d + 2], w[:, 16 + 2 * d : 16 + 2 * d + 2]], 1))
    assert validate_model(model) == []


def test_plan_leaves_input_alone_and_checks_devices():
    model = _gated_mlp(fused=False)
    before = model.SerializeToString()
    megatron_plan(model, 8)
    assert model.SerializeToString() == before
    with pytest.raises(ValueError, match="num_devices must be an int >= 1"):
        megatron_plan(model, 0)
    with pytest.raises(ValueError, match="already exists with 8 devices, not 4"):
        megatron_plan(megatron_plan(model, 8), 4)


def test_indivisible_width_is_left_replicated_with_a_note():
    layout = megatron_layout(_gated_mlp(fused=False), 3)
    assert layout.assignments == ()
    assert [p.ways for p in layout.pairs] == [1]
    assert any("share no divisor with 3 devices" in n for n in layout.notes)


# ------------------------------------------------------------ torch fixtures


def _load(name: str) -> onnx.ModelProto:
    return onnx.load(DATA / f"{name}.onnx")


@pytest.fixture(scope="module", params=["tiny_llama", "tiny_gpt2", "tiny_bert"])
def fixture(request):
    model = _load(request.param)
    return request.param, model, megatron_plan(model, 8)


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gpt2"])
def test_plan_written_in_one_pass_is_byte_identical_to_set_spec_per_assignment(name):
    """write_megatron_plan indexes the nodes once (set_specs); the model it writes is, byte for byte, the
    one set_spec called per assignment writes (each call scanning the graph)."""
    model = _load(name)
    name_nodes(model)
    layout = megatron_layout(model, 8)
    one_pass, per_call = onnx.ModelProto(), onnx.ModelProto()
    one_pass.CopyFrom(model)
    per_call.CopyFrom(model)
    write_megatron_plan(one_pass, layout, "tp")
    add_configuration(per_call, "tp", 8)
    for assignment in layout.assignments:
        set_spec(per_call, assignment.node, assignment.spec, "tp")
    assert len(layout.assignments) > 10
    assert one_pass.SerializeToString(deterministic=True) == per_call.SerializeToString(deterministic=True)
    assert one_pass.SerializeToString(deterministic=True) != model.SerializeToString(deterministic=True)


def test_gqa_choice_is_checked():
    with pytest.raises(ValueError, match="gqa must be one of"):
        megatron_layout(_load("tiny_llama"), 8, gqa="split")


def test_two_pairs_per_layer_on_every_fixture(fixture):
    _, model, _ = fixture
    layout = megatron_layout(model, 8)
    assert [(p.kind, p.layer) for p in layout.pairs] == [
        ("attention", 0),
        ("mlp", 0),
        ("attention", 1),
        ("mlp", 1),
    ]
    assert all(p.ways == 8 for p in layout.pairs)


def test_annotated_fixture_is_valid_and_checks(fixture):
    _, _, annotated = fixture
    onnx.checker.check_model(annotated, full_check=True)
    assert validate_model(annotated) == []
    assert [(c.name, c.num_devices) for c in annotated.configuration] == [("tp", 8)]


def test_annotations_do_not_change_results(fixture):
    ort = pytest.importorskip("onnxruntime")
    name, _, annotated = fixture
    inputs = dict(np.load(DATA / f"{name}.inputs.npz"))
    expected = dict(np.load(DATA / f"{name}.ort_outputs.npz"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        annotated.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    outputs = session.run(None, inputs)
    for info, value in zip(annotated.graph.output, outputs):
        np.testing.assert_allclose(value, expected[info.name], rtol=0, atol=1e-6)


def _weights(written: dict[tuple[str, str], str], names: list[str]) -> list[str]:
    by_tensor = {tensor: text for (_, tensor), text in written.items()}
    return [by_tensor.get(n) for n in names]


@pytest.mark.parametrize("gqa", ["replicate", "groups"])
def test_tiny_llama_weights(gqa):
    # Facts from the graph (tests/data/README.md): per layer q [64,64], k and v
    # [64,32] (4 kv heads of 8 dims), o [64,64], gate/up [64,128], down [128,64];
    # embed_tokens [256,64]; lm_head [64,256].
    model = megatron_plan(_load("tiny_llama"), 8, gqa=gqa)
    written = _written(model)
    kv = "1:4 @ [{0,1},{2,3},{4,5},{6,7}]" if gqa == "groups" else None
    for q, k, v, o, gate, up, down in [
        ("val_112", "val_119", "val_126", "val_209", "val_214", "val_216", "val_217"),
        ("val_222", "val_229", "val_236", "val_315", "val_320", "val_322", "val_323"),
    ]:
        assert _weights(written, [q, k, v, o, gate, up, down]) == [
            f"1:8 @ {ALL8}",
            kv,
            kv,
            f"0:8 @ {ALL8}",
            f"1:8 @ {ALL8}",
            f"1:8 @ {ALL8}",
            f"0:8 @ {ALL8}",
        ]
    assert written[("node_embedding", "model.model.embed_tokens.weight")] == f"0:8 @ {ALL8}"
    assert written[("node_embedding", "embedding")] == REPL8
    assert written[("node_linear_14", "val_328")] == f"1:8 @ {ALL8}"
    assert written[("node_linear_14", "logits")] == f"-1:8 @ {ALL8}"
    # Row-parallel outputs are replicated: the one all-reduce of each pair.
    assert written[("node_linear_3", "linear_3")] == written[("node_linear_6", "linear_6")] == REPL8
    # Embedding, 14 linears (less k/v ×2 layers when replicated), LM head.
    assert len({node for node, _ in written}) == (16 if gqa == "groups" else 12)
    assert validate_model(model) == []


def test_tiny_llama_gqa_devices_hold_the_kv_head_their_query_heads_read():
    model = megatron_plan(_load("tiny_llama"), 8, gqa="groups")
    written = _written(model)
    inits = {i.name: onh.to_array(i) for i in model.graph.initializer}
    q = split(inits["val_112"], parse_spec(written[("node_linear", "val_112")], "val_112"))
    k = split(inits["val_119"], parse_spec(written[("node_linear_1", "val_119")], "val_119"))
    for d in range(8):
        # Query head d (columns 8d..8d+8) reads kv head d // 2 (HF's repeat_kv).
        np.testing.assert_array_equal(q[d], inits["val_112"][:, 8 * d : 8 * d + 8])
        np.testing.assert_array_equal(k[d], inits["val_119"][:, 8 * (d // 2) : 8 * (d // 2) + 8])


def test_tiny_gpt2_weights():
    # c_attn [64,192] = q|k|v, split per part; c_proj / mlp.c_proj row-parallel;
    # lm_head.weight [256,64] is both the token table and (transposed) the head.
    model = megatron_plan(_load("tiny_gpt2"), 8)
    written = _written(model)
    fused = f"1:(3x1,64x8) @ {ALL8}"
    for i, (attn, proj, fc, mproj) in enumerate(
        [("node_addmm", "node_addmm_1", "node_addmm_2", "node_addmm_3"),
         ("node_addmm_4", "node_addmm_5", "node_addmm_6", "node_addmm_7")]
    ):
        prefix = f"model.transformer.h.{i}"
        assert written[(attn, f"{prefix}.attn.c_attn.weight")] == fused
        assert written[(attn, f"{prefix}.attn.c_attn.bias")] == f"-1:(3x1,64x8) @ {ALL8}"
        assert written[(proj, f"{prefix}.attn.c_proj.weight")] == f"0:8 @ {ALL8}"
        assert written[(proj, f"{prefix}.attn.c_proj.bias")] == REPL8
        assert written[(fc, f"{prefix}.mlp.c_fc.weight")] == f"1:8 @ {ALL8}"
        assert written[(fc, f"{prefix}.mlp.c_fc.bias")] == f"-1:8 @ {ALL8}"
        assert written[(mproj, f"{prefix}.mlp.c_proj.weight")] == f"0:8 @ {ALL8}"
        assert written[(mproj, f"{prefix}.mlp.c_proj.bias")] == REPL8
    # Tied table: one vocabulary split for the lookup and the head.
    assert written[("node_embedding", "model.lm_head.weight")] == f"0:8 @ {ALL8}"
    assert written[("node_Transpose_242", "model.lm_head.weight")] == f"0:8 @ {ALL8}"
    assert written[("node_linear", "val_252")] == f"1:8 @ {ALL8}"
    # Position table stays replicated (not annotated).
    assert not any(t == "model.transformer.wpe.weight" for _, t in written)
    # Device d holds columns [8d, 8d+8) of each of q, k, v (heads d).
    w = next(onh.to_array(i) for i in model.graph.initializer if i.name.endswith("h.0.attn.c_attn.weight"))
    shards = split(w, parse_spec(fused, "w"))
    d = 3
    np.testing.assert_array_equal(shards[d], w[:, [c + 64 * p for p in range(3) for c in range(8 * d, 8 * d + 8)]])


def test_tiny_bert_weights():
    model = megatron_plan(_load("tiny_bert"), 8)
    written = _written(model)
    layers = [
        ("val_60", "val_68", "val_76", "val_90", "val_94", "val_103"),
        ("val_107", "val_115", "val_123", "val_136", "val_140", "val_149"),
    ]
    for i, (q, k, v, o, inter, out) in enumerate(layers):
        assert _weights(written, [q, k, v, o, inter, out]) == [f"1:8 @ {ALL8}"] * 3 + [
            f"0:8 @ {ALL8}",
            f"1:8 @ {ALL8}",
            f"0:8 @ {ALL8}",
        ]
        prefix = f"model.encoder.layer.{i}"
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "intermediate.dense"):
            assert _weights(written, [f"{prefix}.{name}.bias"]) == [f"0:8 @ {ALL8}"]
        for name in ("attention.output.dense", "output.dense"):
            assert _weights(written, [f"{prefix}.{name}.bias"]) == [REPL8]
    assert written[("node_embedding", "model.embeddings.word_embeddings.weight")] == f"0:8 @ {ALL8}"
    tensors = {t for _, t in written}
    # Token-type and position tables, and the pooler, stay replicated.
    assert "model.embeddings.token_type_embeddings.weight" not in tensors
    assert "model.embeddings.position_embeddings.weight" not in tensors
    assert "model.pooler.dense.weight" not in tensors
    layout = megatron_layout(model, 8)
    assert layout.lm_head is None
    assert [e.token for e in layout.embeddings] == [True, False, False]


def test_gqa_on_four_devices_splits_kv_plainly():
    layout = megatron_layout(_load("tiny_llama"), 4)
    assert [p.column_ways for p in layout.pairs if p.kind == "attention"] == [(4, 4, 4)] * 2
    assert not any("GQA" in n for n in layout.notes)


def test_gemm_with_transposed_weights_cuts_the_right_axes():
    # Gemm(transB=1) weights are stored [N, K]: the column cuts axis 0, the row axis 1.
    M, H, F = 4, 8, 16
    rng = np.random.default_rng(2)
    graph = oh.make_graph(
        [
            oh.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln", axis=-1),
            oh.make_node("Gemm", ["n", "W1", "b1"], ["h"], name="fc", transB=1),
            oh.make_node("Relu", ["h"], ["r"], name="relu"),
            oh.make_node("Gemm", ["r", "W2", "b2"], ["y"], name="proj", transB=1),
        ],
        "gemm",
        [oh.make_tensor_value_info("x", FLOAT, [M, H])],
        [oh.make_tensor_value_info("y", FLOAT, [M, H])],
        [
            onh.from_array(np.ones(H, np.float32), "g"),
            onh.from_array(np.zeros(H, np.float32), "b"),
            onh.from_array(rng.standard_normal((F, H)).astype(np.float32), "W1"),
            onh.from_array(rng.standard_normal(F).astype(np.float32), "b1"),
            onh.from_array(rng.standard_normal((H, F)).astype(np.float32), "W2"),
            onh.from_array(rng.standard_normal(H).astype(np.float32), "b2"),
        ],
    )
    model = megatron_plan(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), 8)
    assert _written(model) == {
        ("fc", "n"): REPL8,
        ("fc", "W1"): f"0:8 @ {ALL8}",
        ("fc", "b1"): f"-1:8 @ {ALL8}",
        ("fc", "h"): f"-1:8 @ {ALL8}",
        ("proj", "r"): f"1:8 @ {ALL8}",
        ("proj", "W2"): f"1:8 @ {ALL8}",
        ("proj", "b2"): REPL8,
        ("proj", "y"): REPL8,
    }
    assert validate_model(model) == []


def test_unnamed_nodes_are_named_in_the_copy():
    model = _gated_mlp(fused=False)
    for node in model.graph.node:
        node.name = ""
    annotated = megatron_plan(model, 8)
    assert all(n.name for n in annotated.graph.node)
    assert not any(n.name for n in model.graph.node)
    assert validate_model(annotated) == []
    assert len(describe_plan(annotated)) == len(describe_plan(megatron_plan(_gated_mlp(False), 8)))


def test_lone_linears_are_reported():
    layout = megatron_layout(_mlp(), 2)
    assert [(p.columns, p.row) for p in layout.pairs] == [(("mm1",), "mm2")]
    assert any(n.startswith("mm3: linear with no row partner") and n.endswith("left whole")
               for n in layout.notes)


def test_unequal_fused_split_is_left_replicated():
    # q|k|v of widths 16|8|8 (a GQA-style fused projection): no fused axis fits.
    rng = np.random.default_rng(3)
    graph = oh.make_graph(
        [
            oh.make_node("LayerNormalization", ["x", "g"], ["n"], name="ln", axis=-1),
            oh.make_node("MatMul", ["n", "W"], ["qkv"], name="qkv_proj"),
            oh.make_node("Split", ["qkv", "sizes"], ["q", "k", "v"], name="split", axis=-1),
            oh.make_node("Concat", ["k", "v"], ["kv"], name="cat", axis=-1),
            oh.make_node("Mul", ["q", "kv"], ["t"], name="mix"),
            oh.make_node("MatMul", ["t", "Wo"], ["y"], name="o_proj"),
        ],
        "uneven",
        [oh.make_tensor_value_info("x", FLOAT, [2, 3, 8])],
        [oh.make_tensor_value_info("y", FLOAT, [2, 3, 8])],
        [
            onh.from_array(np.ones(8, np.float32), "g"),
            onh.from_array(rng.standard_normal((8, 32)).astype(np.float32), "W"),
            onh.from_array(np.array([16, 8, 8], np.int64), "sizes"),
            onh.from_array(rng.standard_normal((16, 8)).astype(np.float32), "Wo"),
        ],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    layout = megatron_layout(model, 8)
    assert [(p.columns, p.row, p.ways) for p in layout.pairs] == [(("qkv_proj",), "o_proj", 1)]
    assert layout.assignments == ()
    assert any("unequal" in n for n in layout.notes)


def test_op_rules_agree_with_every_written_output(fixture):
    """Each annotated node, run through its op rule on the written input specs,
    yields the written output specs, and the only collectives are the planned
    all-reduces: one for the embedding, one per attention and per MLP pair."""
    rules = pytest.importorskip("sharding.rules")
    from sharding.spec import same_placement

    _, _, annotated = fixture
    graph = onnx.shape_inference.infer_shapes(annotated, data_prop=True).graph
    shapes = {
        info.name: tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim)
        for info in (*graph.input, *graph.output, *graph.value_info)
    }
    shapes.update({i.name: tuple(i.dims) for i in annotated.graph.initializer})
    constants = {i.name: onh.to_array(i) for i in annotated.graph.initializer}
    nodes = {n.name: n for n in annotated.graph.node}
    collectives = []
    for name, config in read_model_configs(annotated)["tp"].items():
        node = nodes[name]
        ctx = rules.NodeContext(
            node,
            tuple(shapes.get(i) for i in node.input),
            tuple(shapes.get(o) for o in node.output),
            constants,
            18,
        )
        outs, diagnostics = rules.rule_for(node.op_type).propagate(ctx, [config.spec_for(i) for i in node.input])
        assert all(d.severity == "note" for d in diagnostics), [str(d) for d in diagnostics]
        collectives += [d for d in diagnostics if d.code == "collective"]
        for tensor, inferred in zip(node.output, outs):
            shape = tuple(d if isinstance(d, int) else 6 for d in shapes[tensor])
            assert same_placement(config.spec_for(tensor), inferred, shape), (name, tensor)
    assert len(collectives) == 5
    assert all("all-reduce" in d.message for d in collectives)
