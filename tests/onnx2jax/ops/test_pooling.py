"""Pooling ops against onnxruntime (and ONNX's reference where onnxruntime lacks the version)."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _model(op, arrays, consts, opset, attrs, n_out, domain=""):
    """One ``op`` node; inputs at ``consts`` positions are Constant nodes (static), the rest graph inputs."""
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    nodes = [
        oh.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(np.asarray(a), n))
        for i, (n, a) in enumerate(zip(names, arrays))
        if a is not None and i in consts
    ]
    feeds = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i not in consts}
    outputs = [f"y{i}" for i in range(n_out)]
    nodes.append(oh.make_node(op, names, outputs, domain=domain, **attrs))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [oh.make_empty_tensor_value_info(o) for o in outputs],
    )
    opsets = [oh.make_opsetid("", opset)] if not domain else [oh.make_opsetid("", 26), oh.make_opsetid(domain, opset)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=10), feeds


def check(op, opset, arrays, *, consts=(), n_out=1, rtol=1e-5, atol=1e-5, oracle="ort", **attrs):
    """``op`` through onnx2jax and an oracle (onnxruntime, or ONNX's reference evaluator): same dtypes, shapes, values."""
    model, feeds = _model(op, arrays, set(consts), opset, attrs, n_out)
    if oracle == "ort":
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
    else:
        expected = ReferenceEvaluator(model).run(None, feeds)
    for info, e in zip(model.graph.output, expected):  # typed outputs, as exporters write them
        e = np.asarray(e)
        info.CopyFrom(oh.make_tensor_value_info(info.name, oh.np_dtype_to_tensor_dtype(e.dtype), e.shape))
    actual = translate(model)(*feeds.values())
    assert len(actual) >= len(expected)
    for e, a in zip(expected, actual):
        e, a = np.asarray(e), np.asarray(a)
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 2, 7), dict(kernel_shape=[3], strides=[2])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ((1, 2, 7, 8), dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
        ((1, 2, 9, 9), dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[1, 1, 1, 1])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 7, 8), dict(kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_LOWER")),
        ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], pads=[0, 1, 1, 0, 1, 1])),
    ],
)
def test_max_pool(shape, attrs):
    check("MaxPool", 12, [_f(*shape)], **attrs)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 6, 5), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[0, 0, 1, 1])),
    ((1, 2, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
])
def test_max_pool_indices(storage_order, shape, attrs):
    check("MaxPool", 12, [_f(*shape)], n_out=2, storage_order=storage_order, **attrs)


@pytest.mark.parametrize("opset", [1, 8, 10, 11, 22])
def test_max_pool_opsets(opset):
    oracle = "ort" if opset < 22 else "reference"
    check("MaxPool", opset, [_f(1, 2, 6, 6)], kernel_shape=[2, 2], strides=[2, 2], oracle=oracle)


def test_max_pool_int8():
    x = RNG.integers(-128, 127, (1, 2, 6, 6)).astype(np.int8)
    check("MaxPool", 12, [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])


@pytest.mark.parametrize(
    "shape,attrs",
    [
        ((1, 2, 7), dict(kernel_shape=[3], strides=[2])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)),
        ((1, 2, 7, 8), dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1)),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1, pads=[1, 1, 1, 1], count_include_pad=1)),
        ((1, 2, 7, 8), dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 5, 6, 7), dict(kernel_shape=[2, 3, 2], pads=[0, 1, 1, 0, 1, 1])),
    ],
)
def test_average_pool(shape, attrs):
    check("AveragePool", 11, [_f(*shape)], **attrs)


@pytest.mark.parametrize("opset", [7, 10, 19, 22])
def test_average_pool_opsets(opset):
    attrs = dict(dilations=[2, 2]) if opset >= 19 else {}
    oracle = "ort" if opset < 22 else "reference"
    check("AveragePool", opset, [_f(1, 2, 7, 7)], kernel_shape=[2, 2], pads=[1, 1, 0, 0], oracle=oracle, **attrs)


@pytest.mark.parametrize("opset,p", [(2, 2), (11, 3), (18, 1)])
def test_lp_pool(opset, p):
    check("LpPool", opset, [_f(1, 2, 6, 7)], kernel_shape=[2, 3], strides=[2, 1], p=p, rtol=1e-4)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_global_pools(op, shape):
    check(op, 1, [_f(*shape)])


def test_global_lp_pool():
    check("GlobalLpPool", 2, [_f(2, 3, 4, 5)], p=3, rtol=1e-4)


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_unpool(with_shape):
    x = _f(1, 2, 4, 4)
    pool, _ = _model("MaxPool", [x], set(), 12, dict(kernel_shape=[2, 2], strides=[2, 2]), 2)
    session = ort.InferenceSession(pool.SerializeToString(), providers=["CPUExecutionProvider"])
    values, indices = session.run(None, {"x0": x})
    arrays = [values, indices] + ([np.array([1, 2, 5, 5], np.int64)] if with_shape else [])
    # With output_shape, onnxruntime writes the flat indices straight into the larger output;
    # ONNX's reference (and its node case) places the inferred-shape result in its corner.
    oracle = "reference" if with_shape else "ort"
    check("MaxUnpool", 11, arrays, consts=(2,), kernel_shape=[2, 2], strides=[2, 2], oracle=oracle)


@pytest.mark.parametrize("mode,sampling_ratio", [("avg", 0), ("max", 2)])
def test_roi_align(mode, sampling_ratio):
    x = _f(2, 3, 10, 10)
    rois = np.array([[0, 0, 9, 9], [1.5, 2.5, 7.2, 6.1], [3, 3, 4, 8]], np.float32)
    batch = np.array([0, 1, 1], np.int64)
    check(
        "RoiAlign", 16, [x, rois, batch], mode=mode, output_height=3, output_width=2,
        sampling_ratio=sampling_ratio, spatial_scale=0.9, rtol=1e-4, atol=1e-5,
    )


def test_max_roi_pool():
    x = _f(2, 3, 8, 8)
    rois = np.array([[0, 0, 0, 7, 7], [1, 1.2, 2.7, 5.1, 6.4]], np.float32)
    check("MaxRoiPool", 1, [x, rois], pooled_shape=[2, 3], spatial_scale=1.0)
