"""Activation functions against onnxruntime, over the opsets they are registered for."""

import numpy as np
import pytest

from opcheck import check, run

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return (RNG.standard_normal(shape) * 3).astype(dtype)


CASES = [
    ("Relu", (6, 13, 14), {}),
    ("LeakyRelu", (6, 16), {"alpha": 0.1}),
    ("ThresholdedRelu", (10, 22), {"alpha": 0.5}),
    ("Elu", (6, 22), {"alpha": 0.7}),
    ("Celu", (12,), {"alpha": 2.0}),
    ("Selu", (6, 22), {}),
    ("Selu", (6,), {"alpha": 1.5, "gamma": 2.0}),
    ("Sigmoid", (6, 13), {}),
    ("HardSigmoid", (6, 22), {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", (14, 22), {}),
    ("Tanh", (6, 13), {}),
    ("Softplus", (1, 22), {}),
    ("Softsign", (1, 22), {}),
    ("Mish", (18, 22), {}),
    ("Gelu", (20,), {}),
    ("Gelu", (20,), {"approximate": "tanh"}),
    ("Shrink", (9,), {"bias": 0.5, "lambd": 1.0}),
]


@pytest.mark.parametrize("op, opsets, attrs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_activation(op, opsets, attrs):
    for opset in opsets:
        check(op, opset, [_x(2, 3, 4)], rtol=1e-5, atol=1e-6, **attrs)


@pytest.mark.parametrize("op", ["Relu", "Sigmoid", "Gelu", "Tanh"])
def test_activation_float16(op):
    check(op, 20, [_x(3, 5, dtype=np.float16)], rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("slope_shape", [(1,), (4,), (3, 1), (2, 3, 4)])
@pytest.mark.parametrize("opset", [7, 9, 16])
def test_prelu_broadcasts_slope(slope_shape, opset):
    check("PRelu", opset, [_x(2, 3, 4), _x(*slope_shape)])


@pytest.mark.parametrize("dtype", [np.int32, np.uint8])
def test_shrink_int(dtype):
    x = np.arange(-5, 6, dtype=np.int32) if dtype == np.int32 else np.arange(0, 11, dtype=np.uint8)
    check("Shrink", 9, [x], bias=1.0, lambd=2.0)


def test_swish():
    x = _x(3, 4)
    (y,) = run("Swish", 24, [x], alpha=1.5)
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.5 * x)), rtol=1e-5, atol=1e-6)


def test_swiglu():
    a, b = _x(3, 4), _x(3, 4)
    (y,) = run("SwiGLU", 28, [a, b])
    np.testing.assert_allclose(y, a / (1 + np.exp(-a)) * b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("slope_shape", [(1,), (2, 3, 4)])
def test_prelu_6(slope_shape):
    x, slope = _x(2, 3, 4), _x(*slope_shape)
    (y,) = run("PRelu", 6, [x, slope])
    np.testing.assert_allclose(y, np.where(x < 0, x * slope, x), rtol=1e-6)
