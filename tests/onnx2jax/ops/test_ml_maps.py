"""DictVectorizer and CastMap (ai.onnx.ml), whose input is a map (a dict), against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import onnx2jax

ML = "ai.onnx.ml"
T = onnx.TensorProto


def _model(node: onnx.NodeProto, key_type: int, value_type: int, out_type: int, then_double: bool) -> onnx.ModelProto:
    """``x`` (a map) -> node -> ``y``; with ``then_double``, ``y * 2`` follows as a jitted segment."""
    nodes = [node]
    out = "y"
    if then_double:
        nodes.append(oh.make_node("Mul", ["y", "two"], ["doubled"]))
        out = "doubled"
    graph = oh.make_graph(
        nodes, "maps",
        [oh.make_value_info("x", oh.make_map_type_proto(key_type, oh.make_tensor_type_proto(value_type, None)))],
        [oh.make_tensor_value_info(out, out_type, None)],
        [onnx.numpy_helper.from_array(np.array(2, onnx.helper.tensor_dtype_to_np_dtype(out_type)), "two")]
        if then_double else [],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(ML, 1)], ir_version=8)


def _compare(model: onnx.ModelProto, x: dict) -> None:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    (actual,) = onnx2jax.translate(model)(x)
    actual = np.asarray(actual)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize("then_double", [False, True])
@pytest.mark.parametrize("x", [{"a": 1.5, "c": -2.0}, {"b": 3.0, "z": 9.0}, {"d": 0.5}])
def test_dict_vectorizer_string_keys(x: dict, then_double: bool) -> None:
    node = oh.make_node("DictVectorizer", ["x"], ["y"], domain=ML, string_vocabulary=["a", "b", "c", "d"])
    _compare(_model(node, T.STRING, T.FLOAT, T.FLOAT, then_double), x)


def test_dict_vectorizer_int64_keys() -> None:
    node = oh.make_node("DictVectorizer", ["x"], ["y"], domain=ML, int64_vocabulary=[30, 10, 70])
    _compare(_model(node, T.INT64, T.FLOAT, T.FLOAT, True), {70: 4.25, 10: -2.5})


@pytest.mark.parametrize("map_form", ["DENSE", "SPARSE"])
@pytest.mark.parametrize("cast_to, out_type", [("TO_FLOAT", T.FLOAT), ("TO_INT64", T.INT64)])
def test_cast_map(map_form: str, cast_to: str, out_type: int) -> None:
    node = oh.make_node("CastMap", ["x"], ["y"], domain=ML, cast_to=cast_to, map_form=map_form, max_map=6)
    _compare(_model(node, T.INT64, T.FLOAT, out_type, True), {3: 1.75, 0: 2.25, 1: -1.5, 5: 7.0})


def test_the_map_reader_is_a_host_step() -> None:
    node = oh.make_node("DictVectorizer", ["x"], ["y"], domain=ML, string_vocabulary=["a", "b"], name="vectorize")
    translated = onnx2jax.translate(_model(node, T.STRING, T.FLOAT, T.FLOAT, True))
    assert [(s.kind, s.nodes) for s in translated.segments][0] == ("host", ("vectorize",))
    assert "reads a map" in translated.segments[0].reason
    with pytest.raises(TypeError, match="input 'x' is a map: give a dict"):
        translated(np.zeros(2, np.float32))
