"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

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



LOSS_CASES = [
    {"reduction": "mean"},
    {"reduction": "sum"},
    {"reduction": "none"},
    {"reduction": "mean", "ignore_index": 1},
    {"reduction": "none", "ignore_index": 2},
]


@pytest.mark.parametrize("attrs", LOSS_CASES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5)])
def test_nll_loss(attrs, weighted, shape):
    target = RNG.integers(0, 3, (shape[0],) + shape[2:]).astype(np.int64)
    weight = np.array([0.2, 0.3, 0.5], np.float32) if weighted else None
    check("NegativeLogLikelihoodLoss", 13, [_f(*shape), target, weight], rtol=1e-5, **attrs)


@pytest.mark.parametrize("attrs", LOSS_CASES)
@pytest.mark.parametrize("weighted", [False, True])
def test_softmax_cross_entropy_loss(attrs, weighted):
    labels = RNG.integers(0, 3, (2, 5)).astype(np.int64)
    weight = np.array([0.2, 0.3, 0.5], np.float32) if weighted else None
    check("SoftmaxCrossEntropyLoss", 13, [_f(2, 3, 5), labels, weight], n_out=2, rtol=1e-5, **attrs)


def test_loss_opset_12():
    labels = RNG.integers(0, 3, (4,)).astype(np.int64)
    check("SoftmaxCrossEntropyLoss", 12, [_f(4, 3), labels], rtol=1e-5)
    check("NegativeLogLikelihoodLoss", 12, [_f(4, 3), labels], rtol=1e-5)
