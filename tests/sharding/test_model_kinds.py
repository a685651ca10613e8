"""The public `sharding` functions take an onnx_ir.Model and a path wherever they take a ModelProto.

Each is compared with the same call on a ModelProto: the annotations written
(`describe_plan`, read back from a proto), the diagnostics, the layouts.
"""

from pathlib import Path

import onnx
import onnx_ir
import pytest

from sharding import (
    add_configuration, annotate_tensor, describe_plan, device_configurations, megatron_layout, megatron_plan,
    parse_spec, read_model_configs, set_spec, set_stage, validate_model,
)

MODEL = Path(__file__).resolve().parents[2] / "onnx2jax" / "data" / "tiny_llama.onnx"


def _ir(proto: onnx.ModelProto) -> onnx_ir.Model:
    return onnx_ir.from_proto(proto)


def _rows(model) -> list:
    proto = model if isinstance(model, onnx.ModelProto) else onnx_ir.to_proto(model)
    return describe_plan(proto)


def test_megatron_plan_returns_the_kind_it_was_given():
    proto = onnx.load(MODEL)
    expected = megatron_plan(proto, 8)
    from_ir = megatron_plan(onnx_ir.load(MODEL), 8)
    from_path = megatron_plan(MODEL, 8)
    from_str = megatron_plan(str(MODEL), 8)
    assert isinstance(from_ir, onnx_ir.Model)
    assert isinstance(from_path, onnx.ModelProto) and isinstance(from_str, onnx.ModelProto)
    assert len(_rows(expected)) > 20
    assert _rows(from_ir) == _rows(expected) == _rows(from_path) == _rows(from_str)
    # onnx-ir writes them to disk and reads them back unchanged.
    assert _rows(onnx_ir.from_proto(onnx_ir.to_proto(from_ir))) == _rows(expected)
    assert megatron_layout(onnx_ir.load(MODEL), 8).assignments == megatron_layout(proto, 8).assignments


def test_in_place_annotation_of_an_ir_model_equals_the_proto_one(tmp_path):
    proto = onnx.load(MODEL)
    model = onnx_ir.load(MODEL)
    for target in (proto, model):
        assert add_configuration(target, "tp", 4) == "tp"
        annotated = annotate_tensor(target, "model.model.embed_tokens.weight", parse_spec("1:4 @ [0,1,2,3]"))
        assert annotated == ["node_embedding"]
        set_spec(target, "node_embedding", parse_spec("2:4 @ [0,1,2,3]", "embedding"))
        set_stage(target, "node_embedding", 0)
    assert len(_rows(proto)) == 2
    assert _rows(model) == _rows(proto)
    path = tmp_path / "annotated.onnx"
    onnx_ir.save(model, path)
    assert describe_plan(path) == describe_plan(proto)
    assert read_model_configs(model) == read_model_configs(proto)
    assert device_configurations(model) == device_configurations(proto)
    assert validate_model(model) == validate_model(proto) == validate_model(path)


def test_in_place_functions_refuse_a_path():
    with pytest.raises(TypeError, match="set_spec edits a model in place: pass a ModelProto or an onnx_ir.Model"):
        set_spec(MODEL, "node_embedding", parse_spec("2:4 @ [0,1,2,3]", "embedding"))


def test_a_failed_edit_leaves_the_ir_model_unchanged():
    model = onnx_ir.load(MODEL)
    add_configuration(model, "tp", 4)
    with pytest.raises(ValueError, match="nosuch"):
        annotate_tensor(model, "nosuch", parse_spec("0:4 @ [0,1,2,3]"))
    assert _rows(model) == []
    assert [c.name for c in model.device_configurations] == ["tp"]
