"""LinearClassifier and LinearRegressor (ai.onnx.ml) against onnxruntime."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from onnx2jax.ops import ml_linear
from tests.onnx2jax.ops import opcheck

check = functools.partial(opcheck.check, domain="ai.onnx.ml", ai_onnx_opset=19, rtol=1e-5, atol=1e-6)
rng = np.random.default_rng(0)
X = rng.normal(size=(20, 3)).astype(np.float32)


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_multiclass(transform):
    coefficients = rng.normal(size=9).round(2).tolist()
    check("LinearClassifier", 1, [X], n_out=2, coefficients=coefficients, intercepts=[0.1, 0.0, -0.3],
          classlabels_ints=[3, 5, 8], post_transform=transform)


def test_one_row_binary():
    # One coefficient row: the label is the second class where the score is > 0, scores are [1 - s, s].
    check("LinearClassifier", 1, [X], n_out=2, coefficients=[0.5, -1.0, 0.25], intercepts=[0.1], classlabels_ints=[2, 7])


def test_string_labels_and_int_input():
    model, feeds = opcheck.single_node_model(
        "LinearClassifier", 1, [rng.integers(-3, 3, size=(6, 2)).astype(np.int64)], n_out=2, domain="ai.onnx.ml",
        ai_onnx_opset=19, coefficients=[1.0, -1.0, 0.5, 0.5], intercepts=[0.0, 0.2], classlabels_strings=["no", "yes"],
    )
    import onnxruntime as ort

    from onnx2jax.translate import translate

    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    labels, scores = translate(model)(*feeds.values())
    assert labels.tolist() == expected[0].tolist()
    np.testing.assert_allclose(np.asarray(scores), expected[1], rtol=1e-6)


@pytest.mark.parametrize("targets", [1, 2])
def test_regressor(targets):
    check("LinearRegressor", 1, [X], coefficients=rng.normal(size=3 * targets).round(2).tolist(),
          intercepts=[0.5] * targets, targets=targets)


def test_regressor_is_differentiable():
    coefficients, intercepts = [0.5, -1.0, 2.0], [1.0]
    grad = jax.grad(lambda x: jnp.sum(ml_linear.linear_regressor(x, coefficients=coefficients, intercepts=intercepts, targets=1, post_transform="NONE")))(X)
    np.testing.assert_allclose(grad, np.broadcast_to(np.float32(coefficients), X.shape))
