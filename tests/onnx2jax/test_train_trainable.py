"""Which initializers are trainable (``onnx2jax.trainable``, ``Compiled.trainable``), on the zoo and fixtures.

The expectation is written from the graphs' consumers, independently of the
rule's walk: weights and biases of MatMul/Gemm/Conv, floating embedding
tables read by Gather, normalisation scales and biases are trainable;
integer and boolean tensors, single values, rotary frequency tables
(``inv_freq``, ``cos_cache``/``sin_cache``) and mask fills are not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.errors import ParameterError
from onnx2jax.trainable import trainable_names

DATA = ZOO.parent
MODELS = [ZOO / f"{n}.onnx" for n in CASES] + [DATA / f"{n}.onnx" for n in ("tiny_llama", "tiny_gpt2", "tiny_bert")]
MODELS += sorted((DATA / "genai").glob("*/model.onnx"))

WEIGHT_SLOTS = {
    ("MatMul", 1), ("MatMul", 0), ("Gemm", 1), ("Gemm", 2), ("Conv", 1), ("Conv", 2), ("Gather", 0),
    ("LayerNormalization", 1), ("LayerNormalization", 2), ("SimplifiedLayerNormalization", 1),
    ("SkipSimplifiedLayerNormalization", 2), ("SkipLayerNormalization", 2), ("SkipLayerNormalization", 3),
    ("BatchNormalization", 1), ("BatchNormalization", 2),
}


def _readers(model: onnx.ModelProto) -> dict[str, set[tuple[str, int]]]:
    readers: dict[str, set[tuple[str, int]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            readers.setdefault(name, set()).add((node.op_type, position))
    return readers


@pytest.mark.parametrize("path", MODELS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_weights_are_trainable_and_constants_are_not(path: Path) -> None:
    model = onnx.load(path)
    trainable = set(trainable_names(model))
    readers = _readers(model)
    floating = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    weights = 0
    for tensor in model.graph.initializer:
        size = int(np.prod(tensor.dims))
        frequency = "inv_freq" in tensor.name or tensor.name in ("cos_cache", "sin_cache")
        if tensor.data_type not in floating or size <= 1 or frequency:
            assert tensor.name not in trainable, tensor.name
        elif readers.get(tensor.name, set()) & WEIGHT_SLOTS:
            weights += 1
            assert tensor.name in trainable, tensor.name
    assert weights > 0 and trainable


def _synthetic() -> onnx.ModelProto:
    """x @ W + causal mask, times cos(positions * inv_freq), resized by float scales; a dead weight."""
    mask = np.triu(np.full((4, 4), np.finfo(np.float32).min, np.float32), 1)
    inits = [
        numpy_helper.from_array(np.full((4, 4), 0.5, np.float32), "W"),
        numpy_helper.from_array(mask, "mask"),
        numpy_helper.from_array(np.array([1.0, 0.01], np.float32), "inv_freq"),
        numpy_helper.from_array(np.arange(4, dtype=np.float32).reshape(4, 1), "positions"),
        numpy_helper.from_array(np.array([1, 1, 1, 1], np.float32), "scales"),
        numpy_helper.from_array(np.array([1, 1, 4, 4], np.int64), "shape"),
        numpy_helper.from_array(np.ones((4, 4), np.float32), "dead"),
        numpy_helper.from_array(np.array(0.125, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "mask"], ["masked"]),
        helper.make_node("Mul", ["positions", "inv_freq"], ["angles"]),
        helper.make_node("Cos", ["angles"], ["cos"]),
        helper.make_node("Tile", ["cos", "two"], ["cos4"]),
        helper.make_node("Mul", ["masked", "cos4"], ["rotated"]),
        helper.make_node("Mul", ["rotated", "scale"], ["scaled"]),
        helper.make_node("Reshape", ["scaled", "shape"], ["image"]),
        helper.make_node("Resize", ["image", "", "scales"], ["y"], mode="nearest"),
        helper.make_node("MatMul", ["x", "dead"], ["unused"]),
    ]
    inits.append(numpy_helper.from_array(np.array([1, 2], np.int64), "two"))
    graph = helper.make_graph(
        nodes, "synthetic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 4, 4])], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_the_rule_on_a_graph_with_every_kind_of_constant() -> None:
    model = _synthetic()
    onnx.checker.check_model(model, full_check=True)
    assert trainable_names(model) == ("W",)


def test_the_rule_can_be_overridden() -> None:
    compiled = onnx2jax.compile(DATA / "tiny_llama.onnx", scan_layers=False)
    assert "model.model.rotary_emb.inv_freq" in compiled.params
    assert "model.model.rotary_emb.inv_freq" not in compiled.trainable
    chosen = compiled.with_trainable(["model.model.norm.weight", "model.model.rotary_emb.inv_freq"])
    assert chosen.trainable == ("model.model.norm.weight", "model.model.rotary_emb.inv_freq")
    assert "model.model.rotary_emb.inv_freq" not in compiled.trainable and chosen.params is compiled.params
    with pytest.raises(ParameterError, match="with_trainable: 'no such weight' is not a parameter of this model"):
        compiled.with_trainable(["no such weight"])
