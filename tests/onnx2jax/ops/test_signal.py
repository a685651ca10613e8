"""DFT, STFT, windows and MelWeightMatrix against onnxruntime (static parameters as initializers)."""

import numpy as np
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _check(op, opset, feeds, inits, names, rtol=1e-4, atol=1e-4, **attrs):
    """``names`` lists the node's inputs in order ('' for omitted); ``inits`` holds the static ones."""
    graph = oh.make_graph(
        [oh.make_node(op, names, ["y"], **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [oh.make_empty_tensor_value_info("y")],
        [onh.from_array(v, n) for n, v in inits.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, feeds)
    (actual,) = translate(model)(**feeds)
    actual = np.asarray(actual)
    assert (actual.dtype, actual.shape) == (expected.dtype, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize(
    "complex_in,attrs,length",
    [
        (False, {}, None),
        (True, {}, None),
        (False, {"onesided": 1}, None),
        (False, {"inverse": 1}, None),
        (True, {"inverse": 1}, None),
        (True, {}, 6),
        (False, {"onesided": 1}, 12),
    ],
)
def test_dft_17(complex_in, attrs, length):
    x = RNG.standard_normal((2, 8, 2 if complex_in else 1)).astype(np.float32)
    inits = {} if length is None else {"n": np.array(length, np.int64)}
    _check("DFT", 17, {"x": x}, inits, ["x", "n" if inits else ""], axis=1, **attrs)


@pytest.mark.parametrize("axis", [1, -2, 2])
def test_dft_20_axis_input(axis):
    x = RNG.standard_normal((2, 4, 6, 2)).astype(np.float32)
    _check("DFT", 20, {"x": x}, {"axis": np.array(axis, np.int64)}, ["x", "", "axis"])


@pytest.mark.parametrize("window", [False, True])
def test_stft(window):
    x = RNG.standard_normal((2, 32, 1)).astype(np.float32)
    feeds = {"x": x}
    inits = {"step": np.array(4, np.int64), "length": np.array(8, np.int64)}
    if window:
        feeds["w"] = np.hanning(8).astype(np.float32)
    _check("STFT", 17, feeds, inits, ["x", "step", "w" if window else "", "length"])


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    _check(op, 17, {}, {"size": np.array(10, np.int64)}, ["size"], atol=1e-6, periodic=periodic)


def test_window_output_datatype():
    _check("HannWindow", 17, {}, {"size": np.array(7, np.int64)}, ["size"], output_datatype=11)


def test_mel_weight_matrix():
    inits = {
        "bins": np.array(8, np.int64),
        "dft": np.array(64, np.int64),
        "rate": np.array(16000, np.int64),
        "low": np.array(0.0, np.float32),
        "high": np.array(8000.0, np.float32),
    }
    _check("MelWeightMatrix", 17, {}, inits, list(inits), atol=1e-6)
