"""Adagrad, Adam and Momentum (ai.onnx.preview.training) against ONNX's reference evaluator.

onnxruntime's default build has no kernels for this domain, so the reference evaluator is the oracle.
"""

import numpy as np
import onnx.helper as oh
import pytest
from onnx.reference import ReferenceEvaluator

from onnx2jax.translate import translate

DOMAIN = "ai.onnx.preview.training"
RNG = np.random.default_rng(0)


def _check(op, state_kinds, n_tensors, step, **attrs):
    f = lambda: RNG.standard_normal((3, 2)).astype(np.float32)  # noqa: E731
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(step, np.int64)}
    names = ["R", "T"]
    for kind in ["X", "G"] + state_kinds:
        for i in range(n_tensors):
            feeds[f"{kind}{i}"] = np.abs(f()) if kind == "H" else f()
            names.append(f"{kind}{i}")
    outputs = [f"{kind}{i}_new" for kind in ["X"] + state_kinds for i in range(n_tensors)]
    graph = oh.make_graph(
        [oh.make_node(op, names, outputs, domain=DOMAIN, **attrs)],
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in feeds.items()],
        [oh.make_empty_tensor_value_info(o) for o in outputs],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid(DOMAIN, 1)], ir_version=10)
    expected = ReferenceEvaluator(model).run(None, feeds)
    actual = translate(model)(**feeds)
    for name, e, a in zip(outputs, expected, actual):
        a = np.asarray(a)
        assert a.dtype == np.float32 and a.shape == e.shape, name
        np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("n", [1, 2])
def test_adagrad(n):
    _check("Adagrad", ["H"], n, 3, decay_factor=0.1, epsilon=1e-6, norm_coefficient=0.01)


@pytest.mark.parametrize("step", [0, 5])
def test_adam(step):
    _check("Adam", ["V", "H"], 2, step, alpha=0.9, beta=0.99, epsilon=1e-6, norm_coefficient=0.01,
           norm_coefficient_post=0.02)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("step", [0, 2])
def test_momentum(mode, step):
    _check("Momentum", ["V"], 2, step, alpha=0.9, beta=0.5, mode=mode, norm_coefficient=0.01)
