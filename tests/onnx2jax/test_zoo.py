"""The zoo (tests/data/zoo) sharded with the Megatron plan on 8 fake CPU devices.

For each exported architecture, at the largest TP degree in (8, 4, 2) its heads
allow (tests/onnx2jax/zoo_cases.py derives the analytic minimum of collectives
from the architecture): the sharded values equal onnxruntime's stored outputs;
the compiled program has exactly the minimum (no all-gather, all-to-all or
collective-permute); each device holds the parameter bytes the plan's specs
predict (computed here from the specs and shapes with `sharding.tiles`); the
weights-only annotations (what another tool would write) give the same
collectives; `explain`'s inference leaves no tensor of the sharded path
unplaced and no reshard that moves data.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from annotation_helpers import weights_only
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding import infer, parse_spec, set_spec
from sharding.megatron import megatron_layout, megatron_plan
from sharding.model_configs import read_model_configs
from sharding.spec import ShardingSpec
from sharding.tiles import device_regions

SHARDED = [name for name, case in CASES.items() if case.tp > 1]


def _params(names: list[str]) -> list:
    return [pytest.param(n, marks=[pytest.mark.slow] if CASES[n].slow else []) for n in names]


@functools.lru_cache(maxsize=None)
def _planned(name: str) -> onnx.ModelProto:
    return megatron_plan(onnx.load(ZOO / f"{name}.onnx"), CASES[name].tp)


def _inputs(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(ZOO / f"{name}.inputs.npz"))


@functools.lru_cache(maxsize=None)
def _compiled(name: str, weights: bool = False):
    model = weights_only(_planned(name)) if weights else _planned(name)
    compiled = onnx2jax.compile(model)
    outputs = compiled(**_inputs(name))
    return compiled, outputs, count_collectives(compiled.compiled_text(**_inputs(name)))


@pytest.mark.parametrize("name", _params(SHARDED))
def test_sharded_values_equal_onnxruntime(name):
    compiled, outputs, _ = _compiled(name)
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    assert len(outputs) == len(reference.files)
    for output_name, value in zip(compiled.model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[output_name], rtol=1e-4, atol=2e-5)


@pytest.mark.parametrize("name", _params(SHARDED))
def test_collectives_are_the_analytic_minimum(name):
    _, _, counts = _compiled(name)
    all_reduce, all_gather = CASES[name].minimum
    others = {k: v for k, v in counts.items() if k not in ("all-reduce", "all-gather") and v}
    assert (counts["all-reduce"], counts["all-gather"], others) == (all_reduce, all_gather, {}), CASES[name].why


def _predicted_bytes(model: onnx.ModelProto, params, num_devices: int) -> dict[int, int]:
    """Per device, the bytes of one copy of each parameter per distinct layout its readers ask.

    A reader's layout is the spec written for it on that node, or the whole
    tensor on every device when it has none.
    """
    (configs,) = read_model_configs(model).values()
    per_device = dict.fromkeys(range(num_devices), 0)
    for name, array in params.items():
        layouts: set[tuple] = set()
        shape = tuple(array.shape)
        for node in model.graph.node:
            if name not in node.input:
                continue
            config = configs.get(node.name)
            written = [s for s in config.specs if s.tensor_name == name] if config else []
            spec = written[0] if written else ShardingSpec.replicated(name, range(num_devices))
            regions = device_regions(spec, shape)
            layouts.add(tuple(sorted((d, tuple(r.shape for r in rs)) for d, rs in regions.items())))
        for layout in layouts:
            for device, shapes in layout:
                per_device[device] += sum(int(np.prod(s)) for s in shapes) * array.dtype.itemsize
    return per_device


@pytest.mark.parametrize("name", _params(SHARDED))
def test_parameter_bytes_per_device_as_the_plan_predicts(name):
    compiled, _, _ = _compiled(name)
    predicted = _predicted_bytes(_planned(name), compiled.logical_params, CASES[name].tp)
    measured = compiled.report().param_bytes_per_device
    assert measured == predicted
    assert max(measured.values()) < sum(
        int(np.prod(a.shape)) * a.dtype.itemsize for a in compiled.logical_params.values()
    )


@pytest.mark.parametrize("name", _params(SHARDED))
def test_weights_only_annotations_give_the_same_collectives(name):
    """What another tool writes (specs on weight nodes and graph outputs only) compiles alike."""
    compiled, outputs, counts = _compiled(name, weights=True)
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    for output_name, value in zip(compiled.model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[output_name], rtol=1e-4, atol=2e-5)
    assert counts == _compiled(name)[2]


@pytest.mark.parametrize("name", _params(SHARDED))
def test_explain_leaves_nothing_unplaced_and_moves_no_data(name):
    """Every node that reads a placed tensor has its outputs placed (no hole in the sharded
    path), and no written spec differs from what reaches it except by a local slice."""
    model = _planned(name)
    shapes = {k: tuple(v.shape) for k, v in _inputs(name).items()}
    result = infer(model, input_shapes=shapes)
    unplaced = [
        (key, found.op_type)
        for key, found in result.nodes.items()
        if any(s is not None for s in found.inputs) and all(s is None for s in found.outputs)
    ]
    assert unplaced == []
    kinds = [(d.node, d.tensor, d.message.rsplit("(", 1)[-1].rstrip(")"))
             for d in result.diagnostics if d.code == "reshard"]
    moves = [k for k in kinds if k[2] != "dynamic-slice"]  # a local slice moves nothing
    assert moves == []


def test_the_cnn_gets_channel_parallel_conv_pairs_and_says_why_the_rest_stays_whole():
    """ResNet: each basic block's conv -> ReLU -> conv is a column/row pair; the stem conv (two
    readers: the block and its residual) and the strided shortcut conv (meets the residual
    Add) would each gather their whole output, so the plan leaves them whole and says where."""
    layout = megatron_layout(onnx.load(ZOO / "resnet.onnx"), 8)
    assert [(p.column, p.row, p.ways) for p in layout.conv_pairs] == [
        ("node_Conv_98", "node_Conv_100", 8), ("node_Conv_102", "node_Conv_104", 8)]
    whole = {note.split(":")[0]: note for note in layout.notes}
    assert "node_Conv_98, node_add_55" in whole["node_Conv_96"]
    assert "node_add_111" in whole["node_Conv_106"]
    assert "left whole" in whole["node_linear"]


@pytest.mark.parametrize("name", _params(SHARDED))
def test_prediction_equals_program(name):
    """Every collective of the compiled HLO is one inference predicted at the same node, and
    the other way round (the report names any difference: node, kind, why). Where XLA merges
    predicted all-reduces (zoo_cases: T5's combiner joins two independent ones; GPT-NeoX's
    parallel residual adds the MLP's partial sums to the attention's before they meet, one
    all-reduce per block where inference predicts one per row), the report names each."""
    merged = {"t5": 1, "gpt_neox": 2}.get(name, 0)
    compiled, _, _ = _compiled(name)
    notes = [n for n in compiled.report(**_inputs(name)).notes
             if n.startswith(("XLA added", "inference predicted"))]
    assert len(notes) == merged and all("merged it with another" in n for n in notes), notes


@pytest.mark.parametrize("name", ["vit", "whisper_encoder", "wav2vec2"])
def test_encoders_with_a_conv_front_end_at_tp4_reach_the_minimum(name):
    """Issue 23's table at TP 4: 4 all-reduces (2 blocks x 2), nothing else; the front end's
    convolutions and projections stay whole, each with the reason in the plan's notes."""
    model = onnx.load(ZOO / f"{name}.onnx")
    layout = megatron_layout(model, 4)
    assert any("convolutions left whole" in note for note in layout.notes)
    compiled = onnx2jax.compile(megatron_plan(model, 4))
    outputs = compiled(**_inputs(name))
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    for output_name, value in zip(compiled.model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[output_name], rtol=1e-4, atol=2e-5)
    counts = count_collectives(compiled.compiled_text(**_inputs(name)))
    assert counts == {"all-reduce": 4, "all-gather": 0, "all-to-all": 0, "collective-permute": 0,
                      "reduce-scatter": 0}


def test_wav2vec2_with_its_feature_projection_split_pays_one_gather():
    """Issue 23's last row: weights-only annotation at TP 4 with the feature projection
    column-split as well. Its output reaches the grouped positional conv (8 groups of 8
    channels, 2 groups per device: local, computed batched over the groups) and then a
    LayerNorm over the split hidden axis whose output must be whole: one all-gather before
    it (not two partial-sum all-reduces and a gather after). Minimum 4 AR + 1 AG, which is
    also what inference predicts, node by node."""
    tp, devices = 4, "0,1,2,3"
    notes = megatron_layout(onnx.load(ZOO / "wav2vec2.onnx"), tp).notes
    assert ("node_MatMul_71: linear with no row partner; splitting it would all-gather its whole "
            "output at node_transpose_1") in "\n".join(notes)  # why the plan itself leaves it whole
    model = weights_only(megatron_plan(onnx.load(ZOO / "wav2vec2.onnx"), tp))
    for tensor, text in (("layer_norm", f"replicated @ [{{{devices}}}]"), ("val_72", f"1:{tp} @ [{devices}]"),
                         ("val_73", f"-1:{tp} @ [{devices}]")):
        set_spec(model, "node_MatMul_71", parse_spec(text, tensor))
    compiled = onnx2jax.compile(model)
    inputs = _inputs("wav2vec2")
    (hidden,) = compiled(**inputs)
    reference = np.load(ZOO / "wav2vec2.ort_outputs.npz")
    np.testing.assert_allclose(np.asarray(hidden), reference["last_hidden_state"], rtol=1e-4, atol=2e-5)
    counts = count_collectives(compiled.compiled_text(**inputs))
    assert (counts["all-reduce"], counts["all-gather"]) == (4, 1)
    assert sum(counts.values()) == 5
    notes = compiled.report(**inputs).notes
    assert not [n for n in notes if n.startswith(("XLA added", "inference predicted"))], notes
