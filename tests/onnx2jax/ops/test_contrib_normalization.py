"""onnxruntime's fused normalisations against its CPU kernels: SimplifiedLayerNormalization (default domain),
SkipSimplifiedLayerNormalization and SkipLayerNormalization (com.microsoft), defaults and every output."""

import functools

import numpy as np
import onnxruntime as ort
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5)
MS = dict(domain="com.microsoft")


def _both(op, opset, arrays, n_out, **kwargs):
    """(onnxruntime's outputs, onnx2jax's) for a one-node model."""
    model, feeds = opcheck.single_node_model(op, opset, arrays, n_out=n_out, **kwargs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds), [np.asarray(a) for a in translate(model)(*feeds.values())]


@pytest.mark.parametrize("opset", [17, 22])
@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-6}, {"axis": 1}, {"axis": -1, "epsilon": 0.1}])
def test_simplified_layer_norm(opset, attrs):
    x = _f(2, 3, 8, scale=1e-3)  # small values: the epsilon default shows
    scale = _f(3, 8) if attrs.get("axis") == 1 else _f(8)
    check("SimplifiedLayerNormalization", opset, [x, scale], n_out=2, **attrs)


@pytest.mark.parametrize("x_type,scale_type", [(np.float16, np.float32), (np.float32, np.float16)])
def test_simplified_layer_norm_output_has_the_scale_type(x_type, scale_type):
    check("SimplifiedLayerNormalization", 22, [_f(2, 3, 8, dtype=x_type), _f(8, dtype=scale_type)], n_out=2,
          rtol=2e-3, atol=4e-3)


@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-5}])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(2, 3, 16), (5, 16)])
def test_skip_simplified_layer_norm(attrs, with_bias, shape):
    arrays = [_f(*shape, scale=1e-3), _f(*shape, scale=1e-3), _f(16)] + ([_f(16)] if with_bias else [])
    expected, actual = _both("SkipSimplifiedLayerNormalization", 1, arrays, 4, **MS, **attrs)
    # onnxruntime does not compute the mean of an RMS norm: output 1 is left out.
    for i in (0, 2, 3):
        opcheck.assert_outputs([expected[i]], [actual[i]], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs", [{}, {"epsilon": 1e-5}])
@pytest.mark.parametrize("optional", ["none", "beta", "bias", "both"])
def test_skip_layer_norm(attrs, optional):
    x, skip = _f(2, 3, 16, scale=1e-3), _f(2, 3, 16, scale=1e-3)
    beta = _f(16) if optional in ("beta", "both") else None
    bias = _f(16, scale=1e-3) if optional in ("bias", "both") else None
    check("SkipLayerNormalization", 1, [x, skip, _f(16), beta, bias], n_out=4, trim=True, **MS, **attrs)


def test_skip_layer_norm_broadcast_skip():
    check("SkipLayerNormalization", 1, [_f(2, 3, 16), _f(3, 16), _f(16), _f(16)], n_out=1, **MS)


@pytest.mark.parametrize("op", ["SkipSimplifiedLayerNormalization", "SkipLayerNormalization"])
def test_skip_norms_float16(op):
    x, skip, gamma = (_f(2, 3, 16, dtype=np.float16) for _ in range(3))
    check(op, 1, [x, skip, gamma[0, 0]], n_out=1, rtol=2e-3, atol=4e-3, **MS)
