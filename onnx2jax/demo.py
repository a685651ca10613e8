"""``onnx2jax demo``: the one command a new user runs first.

Until the bundled transformer fixture lands, it runs a two-layer MLP built
with onnx.helper and checks it against numpy.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh


def _mlp(rng: np.random.Generator) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    w1 = rng.standard_normal((16, 32)).astype(np.float32)
    w2 = rng.standard_normal((32, 8)).astype(np.float32)
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
            oh.make_node("Relu", ["h"], ["a"], name="act"),
            oh.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
        ],
        "mlp",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 16])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])],
        [onh.from_array(w1, "w1"), onh.from_array(w2, "w2")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), w1, w2


def run_demo(console) -> int:
    """Runs the demo; returns the process exit code (1 if the check fails)."""
    import onnx2jax

    rng = np.random.default_rng(0)
    proto, w1, w2 = _mlp(rng)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    (y,) = onnx2jax.translate(proto)(x)
    diff = float(np.max(np.abs(np.asarray(y) - np.maximum(x @ w1, 0) @ w2)))
    console.print(f"MLP output {tuple(y.shape)} {y.dtype}; max |diff| vs numpy: {diff:.3g}")
    return 0 if diff < 1e-4 else 1
