"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss against onnxruntime."""

import numpy as np
import pytest

from opcheck import check, normal_arrays

RNG = np.random.default_rng(0)
_f = normal_arrays(RNG)


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
