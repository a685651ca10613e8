"""Pooling ops against onnxruntime (and ONNX's reference where onnxruntime lacks the version)."""

import functools

import numpy as np
import onnxruntime as ort
import pytest

import opcheck

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


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
    pool, _ = opcheck.single_node_model("MaxPool", 12, [x], n_out=2, kernel_shape=[2, 2], strides=[2, 2])
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
