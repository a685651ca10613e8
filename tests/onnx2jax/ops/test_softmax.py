"""Softmax, LogSoftmax and Hardmax against onnxruntime (opset 1/11 coerce-to-2D, opset 13 per axis)."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _model(op, arrays, static, opset, attrs, n_out=1):
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    feeds = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i not in static}
    inits = [onnx.numpy_helper.from_array(a, n) for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i in static]
    graph = oh.make_graph(
        [oh.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [oh.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10), feeds


def check(op, opset, arrays, *, static=(), n_out=1, rtol=1e-6, atol=1e-6, **attrs):
    """``op`` through onnx2jax and onnxruntime: same dtypes, shapes, and values within tolerance."""
    model, feeds = _model(op, arrays, static, opset, attrs, n_out)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    for info, e in zip(model.graph.output, expected):  # typed outputs, as exporters write them
        info.CopyFrom(oh.make_tensor_value_info(info.name, oh.np_dtype_to_tensor_dtype(e.dtype), e.shape))
    actual = translate(model)(*feeds.values())
    for e, a in zip(expected, actual):
        a = np.asarray(a)
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def run(op, opset, arrays, *, static=(), **attrs):
    model, feeds = _model(op, arrays, static, opset, attrs)
    return [np.asarray(o) for o in translate(model)(*feeds.values())]


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def _int(*shape, dtype=np.int32, low=-20, high=20):
    return RNG.integers(low, high, shape).astype(dtype)



@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_softmax_family(op, opset, axis):
    x = _f(2, 3, 4)
    if op == "Hardmax":
        x = RNG.integers(0, 3, (2, 3, 4)).astype(np.float32)  # ties: the first maximum wins
    attrs = {} if axis is None else {"axis": axis}
    if opset == 1 and axis == -1:
        pytest.skip("negative axes arrived in opset 11")
    check(op, opset, [x], rtol=1e-5, atol=1e-6, **attrs)


def test_softmax_float16():
    check("Softmax", 13, [_f(2, 8, dtype=np.float16)], rtol=2e-3, atol=1e-3)
