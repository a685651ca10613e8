"""onnxruntime's fused GELU activations (com.microsoft) against its CPU kernels."""

import functools

import numpy as np
import pytest

import opcheck

RNG = np.random.default_rng(0)
_f = functools.partial(opcheck.normal_arrays(RNG), scale=3.0)
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-6, domain="com.microsoft")


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_gelu(dtype, tol):
    check("Gelu", 1, [_f(2, 3, 16, dtype=dtype)], rtol=tol, atol=tol)
    check("BiasGelu", 1, [_f(2, 3, 16, dtype=dtype), _f(16, dtype=dtype)], rtol=tol, atol=tol)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-5), (np.float16, 2e-3)])
def test_fast_gelu(with_bias, dtype, tol):
    arrays = [_f(2, 3, 16, dtype=dtype)] + ([_f(16, dtype=dtype)] if with_bias else [])
    check("FastGelu", 1, arrays, rtol=tol, atol=tol)


@pytest.mark.parametrize("attrs", [{}, {"alpha": 1.0}])
def test_quick_gelu(attrs):
    check("QuickGelu", 1, [_f(2, 3, 16)], **attrs)
