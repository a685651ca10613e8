"""Dropout: inference returns the input and an all-True mask; training drops and rescales."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

X = np.random.default_rng(2).standard_normal((4, 50)).astype(np.float32)


def _model(opset, inputs, consts=None, **attrs):
    consts = consts or {}
    names = [*inputs, *consts]
    graph = oh.make_graph(
        [oh.make_node("Dropout", names, ["y", "mask"], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in inputs.items()],
        [oh.make_empty_tensor_value_info("y"), oh.make_empty_tensor_value_info("mask")],
        [onnx.numpy_helper.from_array(v, n) for n, v in consts.items()],
    )
    return onnx.shape_inference.infer_shapes(
        oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    )


@pytest.mark.parametrize("opset", [7, 10, 13, 22])
def test_inference_matches_onnxruntime(opset):
    model = _model(opset, {"x": X})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": X})
    actual = [np.asarray(a) for a in translate(model)(X)]
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype
    np.testing.assert_array_equal(actual[0], expected[0])
    # The mask marks kept elements (ONNX's reference evaluator): all of them.
    # onnxruntime fills opset 7-11 masks with zeros instead; opset 12+ agree.
    assert (actual[1] == 1).all()
    if opset >= 12:
        np.testing.assert_array_equal(actual[1], expected[1])


@pytest.mark.parametrize("training", [False, True])
def test_training_mode_drops_and_rescales(training):
    ratio = np.asarray(0.25, np.float32)
    model = translate(_model(13, {"x": X, "r": ratio, "t": np.asarray(training)}, seed=5))
    y, mask = (np.asarray(v) for v in model(X, ratio, np.asarray(training)))
    assert mask.dtype == np.bool_ and mask.shape == X.shape
    if not training:
        np.testing.assert_array_equal(y, X)
        assert mask.all()
        return
    assert 0.6 < mask.mean() < 0.9
    np.testing.assert_allclose(y[mask], X[mask] / 0.75, rtol=1e-6)
    assert (y[~mask] == 0).all()


def test_ratio_one_drops_everything_without_nans():
    consts = {"r": np.asarray(1.0, np.float32), "t": np.asarray(True)}
    y, mask = (np.asarray(v) for v in translate(_model(22, {"x": X}, consts))(X))
    assert not mask.any() and (y == 0).all()


def test_opset6_is_test():
    y, mask = (np.asarray(v) for v in translate(_model(6, {"x": X}, is_test=1))(X))
    np.testing.assert_array_equal(y, X)
    assert mask.dtype == np.float32 and (mask == 1).all()


@pytest.mark.parametrize("seed", [0, 5, 2**32 + 7])
@pytest.mark.parametrize("ratio_input", ["static", "runtime"])
@pytest.mark.parametrize("ratio_value", [0.3, 0.5, 0.75])
def test_training_mode_draws_what_onnx_reference_draws(seed, ratio_input, ratio_value):
    # With a seed, ONNX's reference evaluator draws numpy's RandomState(seed).uniform: the same mask here,
    # whether the ratio is an initializer (a mask computed while tracing) or a runtime input.
    from onnx.reference import ReferenceEvaluator

    ratio, training = np.asarray(ratio_value, np.float32), np.asarray(True)
    if ratio_input == "static":
        model = _model(13, {"x": X}, {"r": ratio, "t": training}, seed=seed)
        feeds = {"x": X}
    else:
        model = _model(13, {"x": X, "r": ratio, "t": training}, seed=seed)
        feeds = {"x": X, "r": ratio, "t": training}
    # numpy's seeds stop at 2**32 - 1; onnx2jax takes the attribute modulo 2**32.
    reference_model = _model(13, {"x": X}, {"r": ratio, "t": training}, seed=seed % 2**32)
    expected = ReferenceEvaluator(reference_model).run(None, {"x": X})
    actual = [np.asarray(a) for a in translate(model)(*feeds.values())]
    np.testing.assert_array_equal(actual[1], expected[1])
    np.testing.assert_allclose(actual[0], expected[0], rtol=1e-6)


def test_rounded_down_compares_like_float64():
    from onnx2jax.ops.dropout import _rounded_down

    draws = np.array([0.75 - 2.0**-40, 0.75, 0.75 + 2.0**-40, 0.3 - 1e-12, 0.3 + 1e-12])
    for dtype in (np.float32, np.float16):
        for r in (np.asarray(0.75, dtype), np.asarray(0.3, dtype)):
            np.testing.assert_array_equal(_rounded_down(draws, dtype) >= r, draws >= r.astype(np.float64))
