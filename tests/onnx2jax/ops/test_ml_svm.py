"""SVMClassifier and SVMRegressor (ai.onnx.ml) against onnxruntime, on random libsvm/liblinear models."""

import functools

import numpy as np
import pytest

from tests.onnx2jax.ops import opcheck

check = functools.partial(opcheck.check, domain="ai.onnx.ml", ai_onnx_opset=19, rtol=1e-4, atol=1e-5)
rng = np.random.default_rng(0)
X = rng.normal(size=(12, 3)).astype(np.float32)
KERNELS = {"LINEAR": [0.0, 0.0, 0.0], "POLY": [0.5, 1.0, 3.0], "RBF": [0.4, 0.0, 0.0], "SIGMOID": [0.3, 0.2, 0.0]}


def _svc(vectors_per_class, **extra):
    n_vectors, n_classes = sum(vectors_per_class), len(vectors_per_class)
    return dict(
        vectors_per_class=vectors_per_class, support_vectors=rng.normal(size=n_vectors * 3).round(2).tolist(),
        coefficients=rng.normal(size=(n_classes - 1) * n_vectors).round(2).tolist(),
        rho=rng.normal(size=n_classes * (n_classes - 1) // 2).round(2).tolist(), **extra,
    )


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_one_vs_one_votes(kernel):
    check("SVMClassifier", 1, [X], n_out=2, classlabels_ints=[0, 1, 2], kernel_type=kernel,
          kernel_params=KERNELS[kernel], **_svc([2, 3, 2]))


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_two_classes(transform):
    check("SVMClassifier", 1, [X], n_out=2, classlabels_ints=[3, 8], kernel_type="RBF", kernel_params=KERNELS["RBF"],
          post_transform=transform, **_svc([3, 2]))


def test_liblinear():
    check("SVMClassifier", 1, [X], n_out=2, classlabels_ints=[0, 1, 2], coefficients=rng.normal(size=9).round(2).tolist(),
          rho=[0.1], kernel_params=KERNELS["LINEAR"])


@pytest.mark.parametrize("kernel", ["LINEAR", "POLY", "RBF"])
def test_regressor(kernel):
    check("SVMRegressor", 1, [X], kernel_type=kernel, kernel_params=KERNELS[kernel], n_supports=4,
          support_vectors=rng.normal(size=12).round(2).tolist(), coefficients=rng.normal(size=4).round(2).tolist(),
          rho=[0.3])


def test_regressor_liblinear_one_class():
    check("SVMRegressor", 1, [X], coefficients=[0.5, -1.0, 0.25], rho=[0.1], kernel_params=KERNELS["LINEAR"], one_class=1)
