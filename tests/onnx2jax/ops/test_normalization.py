"""Normalisations against onnxruntime (and ONNX's reference where onnxruntime lacks the op), over their opsets."""

import functools

import numpy as np
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


def _pos(*shape):
    return (RNG.random(shape) + 0.5).astype(np.float32)


@pytest.mark.parametrize(
    "opset,shape", [(6, (2, 3, 4, 5)), (7, (2, 3)), (9, (2, 3, 5)), (14, (1, 3, 2, 3, 4)), (15, (2, 3, 4, 5))]
)
def test_batch_normalization_inference(opset, shape):
    c = shape[1]
    attrs = {"is_test": 1} if opset == 6 else {}
    oracle = "reference" if opset == 6 else "ort"  # onnxruntime has no BatchNormalization-6 kernel
    check("BatchNormalization", opset, [_f(*shape), _f(c), _f(c), _f(c), _pos(c)], epsilon=1e-3, oracle=oracle, **attrs)


def test_batch_normalization_training_outputs():
    x, scale, bias, mean, var = _f(4, 3, 5), _f(3), _f(3), _f(3), _pos(3)
    check(
        "BatchNormalization", 15, [x, scale, bias, mean, var], n_out=3, training_mode=1, momentum=0.8,
        oracle="reference",
    )


@pytest.mark.parametrize("opset", [6, 22])
@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5)])
def test_instance_normalization(opset, shape):
    check("InstanceNormalization", opset if opset != 22 else 22, [_f(*shape), _f(3), _f(3)], epsilon=1e-4,
          oracle="ort" if opset < 22 else "reference")


@pytest.mark.parametrize(
    "shape,axis,bias", [((2, 5, 8), -1, True), ((2, 5, 8), 1, True), ((4, 8), -1, False), ((2, 3, 4, 5), 2, True)]
)
def test_layer_normalization(shape, axis, bias):
    scale_shape = shape[axis:] if axis >= 0 else shape[axis:]
    arrays = [_f(*shape), _f(*scale_shape), _f(*scale_shape) if bias else None]
    # onnxruntime 1.32 crashes on a LayerNormalization without its optional bias.
    check("LayerNormalization", 17, arrays, n_out=3, axis=axis, epsilon=1e-5, oracle="ort" if bias else "reference")


def test_layer_normalization_float16_stash_float32():
    x = (_f(2, 4, 16) * 3).astype(np.float16)
    arrays = [x, _f(16).astype(np.float16), _f(16).astype(np.float16)]
    check("LayerNormalization", 17, arrays, n_out=3, rtol=2e-3, atol=2e-3)  # Mean, InvStdDev: float32


@pytest.mark.parametrize("shape,axis", [((2, 5, 8), -1), ((2, 5, 8), 1), ((3, 16), -1)])
def test_rms_normalization(shape, axis):
    check("RMSNormalization", 23, [_f(*shape), _f(*shape[axis:])], axis=axis, epsilon=1e-6)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_normalization(opset):
    x = _f(2, 6, 3, 4)
    groups = 3
    params = 6 if opset == 21 else groups
    check("GroupNormalization", opset, [x, _f(params), _f(params)], num_groups=groups, epsilon=1e-5, oracle="reference")


@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_lp_normalization(p, axis):
    check("LpNormalization", 1, [_f(3, 4, 5)], p=p, axis=axis)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn(size):
    check("LRN", 13, [_f(2, 6, 3, 4)], size=size, alpha=1e-3, beta=0.75, bias=1.5)


def test_lrn_even_size():
    # onnxruntime only takes odd sizes; the spec's window is [c - floor((s-1)/2), c + ceil((s-1)/2)].
    x = _f(2, 6, 3, 4)
    size, alpha, beta, bias = 4, 1e-2, 0.75, 1.5
    square_sum = np.zeros_like(x)
    for c in range(6):
        lo, hi = max(0, c - (size - 1) // 2), min(6, c + -(-(size - 1) // 2) + 1)
        square_sum[:, c] = (x[:, lo:hi] ** 2).sum(axis=1)
    expected = x / (bias + alpha / size * square_sum) ** beta
    model, feeds = opcheck.single_node_model("LRN", 13, [x], size=size, alpha=alpha, beta=beta, bias=bias)
    np.testing.assert_allclose(np.asarray(translate(model)(x)[0]), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("axes", [(0, 2, 3), (2, 3), (1,)])
def test_mean_variance_normalization(axes):
    check("MeanVarianceNormalization", 13, [_f(2, 3, 4, 5)], axes=list(axes), rtol=1e-4, atol=1e-4)
