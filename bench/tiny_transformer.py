"""Tiny pre-norm transformer exports, built with onnx.helper: width 64, 4 heads, any depth.

Each layer: LayerNormalization -> MatMul to q|k|v -> Split -> heads (Reshape,
Transpose) -> q k^T * 1/4 -> Softmax -> @ v -> merge heads -> MatMul -> residual
Add -> LayerNormalization -> MatMul 64x256 -> SiLU (x * Sigmoid(x)) -> MatMul
256x64 -> residual Add. The input is the float hidden state [batch, seq, 64]
(no embedding), so per-call time is the layers and the runtime's overhead.

    python bench/tiny_transformer.py --layers 8 -o /tmp/tiny8.onnx
"""

from __future__ import annotations

import argparse

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WIDTH, HEADS, FFN = 64, 4, 256


def tiny_transformer(layers: int, seed: int = 0) -> onnx.ModelProto:
    """A ``layers``-deep model with input ``x`` and output ``y``, both float32 [batch, seq, 64]."""
    rng = np.random.default_rng(seed)
    head = WIDTH // HEADS
    inits = [
        numpy_helper.from_array(np.array([0, 0, HEADS, head], np.int64), "heads_shape"),
        numpy_helper.from_array(np.array([0, 0, WIDTH], np.int64), "merged_shape"),
        numpy_helper.from_array(np.float32(1 / np.sqrt(head)), "scale"),
        numpy_helper.from_array(np.array([WIDTH] * 3, np.int64), "qkv_split"),
    ]
    nodes = []
    x = "x"

    def weight(name: str, shape: tuple[int, ...], std: float) -> str:
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name))
        return name

    for i in range(layers):
        p = f"l{i}_"
        gamma = numpy_helper.from_array(np.ones(WIDTH, np.float32), p + "ln1_g")
        beta = numpy_helper.from_array(np.zeros(WIDTH, np.float32), p + "ln1_b")
        gamma2 = numpy_helper.from_array(np.ones(WIDTH, np.float32), p + "ln2_g")
        beta2 = numpy_helper.from_array(np.zeros(WIDTH, np.float32), p + "ln2_b")
        inits += [gamma, beta, gamma2, beta2]
        wqkv = weight(p + "wqkv", (WIDTH, 3 * WIDTH), 0.1)
        wo = weight(p + "wo", (WIDTH, WIDTH), 0.1)
        w1 = weight(p + "w1", (WIDTH, FFN), 0.1)
        w2 = weight(p + "w2", (FFN, WIDTH), 0.05)
        nodes += [
            helper.make_node("LayerNormalization", [x, p + "ln1_g", p + "ln1_b"], [p + "h"], axis=-1),
            helper.make_node("MatMul", [p + "h", wqkv], [p + "qkv"]),
            helper.make_node("Split", [p + "qkv", "qkv_split"], [p + "q", p + "k", p + "v"], axis=-1),
        ]
        for t in ("q", "k", "v"):
            nodes += [
                helper.make_node("Reshape", [p + t, "heads_shape"], [p + t + "4"]),
                helper.make_node("Transpose", [p + t + "4"], [p + t + "h"], perm=[0, 2, 1, 3]),
            ]
        nodes += [
            helper.make_node("Transpose", [p + "kh"], [p + "kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [p + "qh", p + "kt"], [p + "s0"]),
            helper.make_node("Mul", [p + "s0", "scale"], [p + "s"]),
            helper.make_node("Softmax", [p + "s"], [p + "a"], axis=-1),
            helper.make_node("MatMul", [p + "a", p + "vh"], [p + "o4"]),
            helper.make_node("Transpose", [p + "o4"], [p + "ot"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "ot", "merged_shape"], [p + "o"]),
            helper.make_node("MatMul", [p + "o", wo], [p + "proj"]),
            helper.make_node("Add", [x, p + "proj"], [p + "r1"]),
            helper.make_node("LayerNormalization", [p + "r1", p + "ln2_g", p + "ln2_b"], [p + "h2"], axis=-1),
            helper.make_node("MatMul", [p + "h2", w1], [p + "f1"]),
            helper.make_node("Sigmoid", [p + "f1"], [p + "sg"]),
            helper.make_node("Mul", [p + "f1", p + "sg"], [p + "act"]),
            helper.make_node("MatMul", [p + "act", w2], [p + "f2"]),
            helper.make_node("Add", [p + "r1", p + "f2"], [p + "out"]),
        ]
        x = p + "out"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    graph = helper.make_graph(
        nodes,
        f"tiny_transformer_{layers}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("-o", "--output", required=True)
    args = parser.parse_args()
    onnx.save(tiny_transformer(args.layers), args.output)


if __name__ == "__main__":
    main()
