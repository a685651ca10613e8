"""Float64 weights stay float64 on the device, unsharded and sharded.

Outside JAX's x64 mode ``device_put`` rounds a float64 array to float32: a
float64 model then computed with rounded weights while its inputs and outputs
were float64 (w = 1/3 gave 3 x 1/3 = 1 + 3e-8). The reference is numpy's
float64 product.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2jax
from sharding.annotate import add_configuration, annotate_tensor
from sharding.spec import ShardingSpec


def _model(dtype: int) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((8, 8), 1 / 3, helper.tensor_dtype_to_np_dtype(dtype)), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", dtype, [2, 8])], [helper.make_tensor_value_info("y", dtype, [2, 8])], [w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _sharded(model: onnx.ModelProto) -> onnx.ModelProto:
    add_configuration(model, "tp", 8)
    annotate_tensor(model, "w", ShardingSpec.split("w", {1: 8}, tuple(range(8))))
    return model


@pytest.mark.parametrize("sharded", [False, True], ids=["one-device", "tp8"])
def test_float64_weights_are_not_rounded(sharded):
    model = _model(TensorProto.DOUBLE)
    model = _sharded(model) if sharded else model
    compiled = onnx2jax.compile(model)
    x = np.linspace(-1, 1, 16).reshape(2, 8)
    (y,) = compiled(x)
    assert compiled.params["w"].dtype == np.float64 and y.dtype == np.float64
    expected = onnxruntime.InferenceSession(_model(TensorProto.DOUBLE).SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(np.asarray(y), x @ np.full((8, 8), 1 / 3), rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-15, atol=1e-15)


def test_float32_weights_stay_float32():
    compiled = onnx2jax.compile(_sharded(_model(TensorProto.FLOAT)))
    assert compiled.params["w"].dtype == np.float32
