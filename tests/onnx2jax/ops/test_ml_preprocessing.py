"""Scaler, Normalizer, Binarizer, Imputer, ArrayFeatureExtractor, FeatureVectorizer (ai.onnx.ml) against onnxruntime."""

import functools

import numpy as np
import pytest

from tests.onnx2jax.ops import opcheck

check = functools.partial(opcheck.check, domain="ai.onnx.ml", ai_onnx_opset=19, rtol=1e-6, atol=1e-6)
rng = np.random.default_rng(0)
X = rng.normal(size=(8, 3)).astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_scaler(dtype):
    check("Scaler", 1, [(X * 4).astype(dtype)], offset=[0.5, -1.0, 2.0], scale=[2.0, 0.5, -1.0])


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm):
    x = X.copy()
    x[0] = 0  # a zero row is kept as it is
    check("Normalizer", 1, [x], norm=norm)


def test_binarizer():
    check("Binarizer", 1, [X], threshold=0.25)


@pytest.mark.parametrize(
    "x, attrs",
    [
        (np.where(X > 1, np.nan, X).astype(np.float32), {"imputed_value_floats": [1.0, 2.0, 3.0], "replaced_value_float": np.nan}),
        (X.round(), {"imputed_value_floats": [9.0], "replaced_value_float": 0.0}),
        (np.array([[1, 0], [0, 3]], np.int64), {"imputed_value_int64s": [7, 8], "replaced_value_int64": 0}),
    ],
)
def test_imputer(x, attrs):
    check("Imputer", 1, [x], **attrs)


@pytest.mark.parametrize("indices", [np.array([2, 0], np.int64), np.array([[1]], np.int64)])
def test_array_feature_extractor(indices):
    check("ArrayFeatureExtractor", 1, [X, indices], inits=(1,))
    check("ArrayFeatureExtractor", 1, [X[0], indices], inits=(1,))


def test_array_feature_extractor_picks_strings_at_run_time():
    # skl2onnx picks class names this way: a string table, an index computed by the graph.
    import onnx
    import onnx.helper as oh
    import onnxruntime as ort

    from onnx2jax.translate import translate

    classes = onnx.numpy_helper.from_array(np.array(["cat", "dog", "eel"], dtype=object), "classes")
    graph = oh.make_graph(
        [oh.make_node("ArgMax", ["x"], ["i"], axis=1, keepdims=0),
         oh.make_node("ArrayFeatureExtractor", ["classes", "i"], ["y"], domain="ai.onnx.ml")],
        "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.STRING, None)], [classes],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19), oh.make_opsetid("ai.onnx.ml", 3)], ir_version=10)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    (got,) = translate(model)(X)
    assert got.dtype == object and got.tolist() == expected.tolist()


def test_feature_vectorizer():
    check("FeatureVectorizer", 1, [X, X[:, :2]], inputdimensions=[2, 3])
