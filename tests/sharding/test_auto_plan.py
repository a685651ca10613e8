"""`sharding.auto_plan` without jax: candidates evaluated as data, the search's work, its named errors.

References: inference of the model with the same specs written into it (`sharding.infer` on an
annotated copy, the path every compile takes), shard geometry from `sharding.tiles`, and the
hand plan (`megatron_plan`). What the compiled programs hold is tested in
tests/onnx2jax/test_auto_plans.py.
"""

from __future__ import annotations

import copy
import pathlib

import numpy as np
import onnx
import pytest

import sharding.auto.search as search_module
from sharding import auto_plan, describe_plan, infer, read_model_configs
from sharding.auto import DeviceSplitError, MemoryLimitError, MeshShapeError
from sharding.auto.analysis import PlanAnalysis
from sharding.auto.cost import DEFAULT_RATES, predict
from sharding.megatron import megatron_layout, megatron_plan
from sharding.model_configs import NodeConfig
from sharding.spec import ShardingSpec
from sharding.stage_cut import declared_shapes
from sharding.tiles import device_regions

ZOO = pathlib.Path(__file__).resolve().parents[1] / "data" / "zoo"


def _zoo(name: str) -> onnx.ModelProto:
    return onnx.load(ZOO / f"{name}.onnx")


def _param_bytes(model: onnx.ModelProto, num_devices: int) -> int:
    """Most parameter bytes on a device: one copy per distinct layout its readers ask (written spec, else whole)."""
    (configs,) = read_model_configs(model).values()
    per_device = dict.fromkeys(range(num_devices), 0)
    for init in model.graph.initializer:
        if init.data_type != onnx.TensorProto.FLOAT:
            continue
        layouts = set()
        for node in model.graph.node:
            if init.name not in node.input:
                continue
            config = configs.get(node.name)
            written = [s for s in config.specs if s.tensor_name == init.name] if config else []
            spec = written[0] if written else ShardingSpec.replicated(init.name, range(num_devices))
            regions = device_regions(spec, tuple(init.dims))
            layouts.add(tuple(sorted((d, tuple(r.shape for r in rs)) for d, rs in regions.items())))
        for layout in layouts:
            for device, shapes in layout:
                per_device[device] += sum(int(np.prod(s)) for s in shapes) * 4
    return max(per_device.values())


@pytest.mark.parametrize("name,devices", [("gpt2", 8), ("mistral", 8), ("vit", 4), ("resnet", 4)])
def test_a_candidate_evaluated_as_data_predicts_what_inference_of_the_annotated_model_does(name, devices):
    model = _zoo(name)
    shapes = declared_shapes(model, 2, 16)
    analysis = PlanAnalysis(model, shapes)
    layout = megatron_layout(analysis.model, devices, graph=analysis.graph)
    evaluation = analysis.evaluate(layout.assignments, devices)
    written = megatron_plan(model, devices)
    result = infer(written, input_shapes=shapes)
    expected = sorted((d.expected, d.node, d.tensor) for d in result.diagnostics if d.code == "collective")
    assert sorted((c.kind, c.node, c.tensor) for c in evaluation.collectives) == expected
    assert not evaluation.errors and not result.errors()
    assert evaluation.max_param_bytes == _param_bytes(written, devices)


def test_the_search_infers_shapes_once_and_writes_one_model_whatever_the_candidates(monkeypatch):
    """One ONNX shape inference for the whole search, no ModelProto deep-copied per candidate, and
    the annotations written into one model, the winner's."""
    calls = {"shapes": 0, "deepcopy": 0, "written": 0}
    real_shapes, real_deepcopy, real_write = onnx.shape_inference.infer_shapes, copy.deepcopy, search_module.write_plan

    def counting_shapes(*args, **kwargs):
        calls["shapes"] += 1
        return real_shapes(*args, **kwargs)

    def counting_deepcopy(value, *args, **kwargs):
        calls["deepcopy"] += isinstance(value, onnx.ModelProto)
        return real_deepcopy(value, *args, **kwargs)

    def counting_write(*args, **kwargs):
        calls["written"] += 1
        return real_write(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counting_shapes)
    monkeypatch.setattr(copy, "deepcopy", counting_deepcopy)
    monkeypatch.setattr(search_module, "write_plan", counting_write)
    _, report = auto_plan(_zoo("mistral"), 8, batch=2, seq=16)
    assert len(report.rows) >= 5
    assert calls == {"shapes": 1, "deepcopy": 0, "written": 1}


def test_the_winner_is_written_once_with_its_specs_and_the_input_is_untouched():
    model = _zoo("qwen2")
    before = model.SerializeToString()
    annotated, report = auto_plan(model, 8, batch=2, seq=16)
    assert model.SerializeToString() == before
    assert report.winner.name == report.rows[0].name == "tensor 8, kv-groups"
    rows = describe_plan(annotated)
    assert {r.configuration for r in rows} == {"auto"}
    # The kv-groups layout holds fewer parameter bytes than the hand plan (kv heads split by groups).
    assert report.winner.param_bytes < report.hand.param_bytes
    assert _param_bytes(annotated, 8) == report.winner.param_bytes


def test_no_candidate_holds_more_than_the_hand_plan_when_no_limit_is_given():
    for name in ("mistral", "vit", "resnet", "qwen2_moe"):
        _, report = auto_plan(_zoo(name), 2, batch=2, seq=16)
        assert report.winner.param_bytes <= report.hand.param_bytes
        assert report.winner.memory <= report.hand.memory
        assert report.winner.seconds <= report.hand.seconds


def test_a_cnn_given_a_divisible_batch_runs_data_parallel_and_moves_nothing():
    _, report = auto_plan(_zoo("resnet"), 8, batch=8)
    assert (report.winner.data, report.winner.tensor, report.winner.collective_bytes) == (8, 1, 0)
    _, without = auto_plan(_zoo("resnet"), 8)
    assert without.winner.data == 1 and without.winner.collective_bytes > 0


def test_train_adds_the_gradient_all_reduce_over_the_data_replicas():
    model = _zoo("resnet")
    analysis = PlanAnalysis(model, declared_shapes(model, 8, 16))
    _, report = auto_plan(model, 8, batch=8, objective="train", memory_per_device=10**9)
    data = next(r for r in report.rows if r.name == "data 8")
    params = data.param_bytes
    gradients = DEFAULT_RATES.latency["all-reduce"] + 2 * 7 / 8 * params / DEFAULT_RATES.bandwidth["all-reduce"]
    assert data.communication == pytest.approx(gradients)
    assert data.memory >= 4 * params  # parameters, gradients, two Adam moments
    forward = predict(analysis.evaluate({}, 8), DEFAULT_RATES, "latency")
    assert forward.communication == 0


@pytest.mark.parametrize("devices", [(3, 3), {"pipeline": 2, "tensor": 4}, (0, 8), 0, (2, 4, 1)])
def test_a_mesh_shape_that_does_not_exist_is_named(devices):
    with pytest.raises(MeshShapeError, match="mesh shape|devices must be"):
        auto_plan(_zoo("gpt2"), devices)


def test_a_mesh_shape_no_batch_divides_is_named():
    with pytest.raises(MeshShapeError, match="data 4 x tensor 2 does not exist.*batch divisible by 4"):
        auto_plan(_zoo("gpt2"), {"data": 4, "tensor": 2}, batch=2)


def test_a_device_count_that_cannot_split_the_model_is_named():
    with pytest.raises(DeviceSplitError, match="3 devices cannot split this model"):
        auto_plan(_zoo("vit"), 3)
    _, report = auto_plan(_zoo("vit"), 3, batch=3)  # the batch splits where the heads cannot
    assert report.winner.data == 3


def test_a_memory_limit_no_layout_meets_names_the_smallest_that_fits():
    with pytest.raises(MemoryLimitError, match=r"fits 10,000 bytes per device: the smallest is ([0-9,]+)") as error:
        auto_plan(_zoo("gpt2"), 8, memory_per_device=10_000)
    smallest = int(error.value.args[0].split("the smallest is ")[1].split(" ")[0].replace(",", ""))
    _, report = auto_plan(_zoo("gpt2"), 8, memory_per_device=smallest)
    assert report.winner.memory == smallest
    with pytest.raises(MemoryLimitError):
        auto_plan(_zoo("gpt2"), 8, memory_per_device=smallest - 1)


def test_infer_with_written_specs_names_what_it_needs():
    model = _zoo("gpt2")
    with pytest.raises(ValueError, match="needs the configuration"):
        infer(model, written={})
    with pytest.raises(ValueError, match="names nodes the model lacks: \\['nowhere'\\]"):
        infer(model, "auto", written={"nowhere": NodeConfig("auto", ())})
