"""RNN, GRU and LSTM against onnxruntime: directions, layouts, sequence lengths, initial states, clip."""

import numpy as np
import onnx.helper as oh
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
SEQ, BATCH, IN, HIDDEN = 5, 3, 4, 6


def _model(op, opset, feeds, names, outputs, attrs):
    node = oh.make_node(op, names, outputs, hidden_size=HIDDEN, **attrs)
    graph = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [oh.make_empty_tensor_value_info(o) for o in outputs],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)


def _check(op, opset, *, layout=0, lens=None, initial=False, peepholes=False, **attrs):
    """Compares with onnxruntime; layout=1 (which onnxruntime lacks) against its layout-0 run, transposed."""
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    g = GATES[op]
    f = lambda *s: (RNG.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    inputs = {"X": f(SEQ, BATCH, IN), "W": f(dirs, g * HIDDEN, IN), "R": f(dirs, g * HIDDEN, HIDDEN)}
    inputs["B"] = f(dirs, 2 * g * HIDDEN)
    inputs["sequence_lens"] = None if lens is None else np.array(lens, np.int32)
    inputs["initial_h"] = f(dirs, BATCH, HIDDEN) if initial else None
    if op == "LSTM":
        inputs["initial_c"] = f(dirs, BATCH, HIDDEN) if initial else None
        inputs["P"] = f(dirs, 3 * HIDDEN) if peepholes else None
    names = [n if v is not None else "" for n, v in inputs.items()]
    feeds = {n: v for n, v in inputs.items() if v is not None}
    outputs = ["Y", "Y_h", "Y_c"][: 3 if op == "LSTM" else 2]
    session = ort.InferenceSession(
        _model(op, opset, feeds, names, outputs, attrs).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    expected = session.run(None, feeds)
    if layout:
        batch_major = {"X": (1, 0, 2), "initial_h": (1, 0, 2), "initial_c": (1, 0, 2)}
        feeds = {n: v.transpose(batch_major[n]) if n in batch_major else v for n, v in feeds.items()}
        expected = [expected[0].transpose(2, 0, 1, 3)] + [e.transpose(1, 0, 2) for e in expected[1:]]
        attrs["layout"] = 1
    actual = translate(_model(op, opset, feeds, names, outputs, attrs))(**feeds)
    for name, e, a in zip(outputs, expected, actual):
        a = np.asarray(a)
        assert (a.dtype, a.shape) == (e.dtype, e.shape), name
        np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_reverse_with_initial_state(op):
    _check(op, 14, direction="reverse", initial=True)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_sequence_lens(op):
    _check(op, 14, direction="bidirectional", lens=[5, 2, 3], initial=True)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_batch_major_layout(op):
    _check(op, 14, direction="bidirectional", layout=1, initial=True)


@pytest.mark.parametrize("opset", [7, 22])
def test_gru_linear_before_reset(opset):
    _check("GRU", opset, linear_before_reset=1)


def test_lstm_peepholes_and_clip():
    _check("LSTM", 7, peepholes=True, initial=True, clip=0.5)


def test_rnn_activations_with_parameters():
    _check("RNN", 14, direction="bidirectional", activations=["LeakyRelu", "HardSigmoid"], activation_alpha=[0.2, 0.3],
           activation_beta=[0.4])


def test_lstm_input_forget():
    _check("LSTM", 14, direction="bidirectional", initial=True, input_forget=1)
