"""Times `sharding.infer` on a synthetic 10,000-node tensor-parallel graph.

Each of the N blocks is a Megatron MLP with a residual and a norm, written as
10 nodes: MatMul (column-parallel, annotated) -> Gelu -> Mul by a scalar ->
MatMul (row-parallel, annotated) -> Add residual -> LayerNormalization ->
Reshape to heads -> Transpose -> Transpose back -> Reshape back. Only the
MatMuls carry specs; inference completes the other 8 nodes of each block.

Usage: python bench/bench_infer.py [--nodes 10000] [--devices 8] [--repeat 3]
Prints the node count, the best wall and CPU time of `infer` (shape
inference included) and the per-node cost. On a loaded machine the wall time
includes waiting for a core; the CPU time does not.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from sharding import infer
from sharding.model_configs import NodeConfig
from sharding.spec import ShardingSpec

HIDDEN, FFN, HEADS = 64, 256, 8
PER_BLOCK = 10


def synthetic(nodes: int, devices: int) -> onnx.ModelProto:
    """A chain of MLP blocks with about ``nodes`` nodes, MatMuls annotated for ``devices``."""
    blocks = max(1, nodes // PER_BLOCK)
    graph_nodes, inputs = [], [helper.make_tensor_value_info("x0", TensorProto.FLOAT, ["batch", 16, HIDDEN])]
    inits = [
        numpy_helper.from_array(np.float32(0.5), "half"),
        numpy_helper.from_array(np.ones(HIDDEN, np.float32), "gamma"),
        numpy_helper.from_array(np.array([0, 16, HEADS, HIDDEN // HEADS], np.int64), "heads"),
        numpy_helper.from_array(np.array([0, 16, HIDDEN], np.int64), "flat"),
    ]
    column = lambda name: ShardingSpec.split(name, {1: devices}, range(devices))  # noqa: E731
    row = lambda name: ShardingSpec.split(name, {0: devices}, range(devices))  # noqa: E731
    x = "x0"
    for b in range(blocks):
        w1, w2 = f"w1_{b}", f"w2_{b}"
        inputs += [helper.make_tensor_value_info(w1, TensorProto.FLOAT, [HIDDEN, FFN]),
                   helper.make_tensor_value_info(w2, TensorProto.FLOAT, [FFN, HIDDEN])]
        t = lambda s: f"{s}_{b}"  # noqa: E731
        up = helper.make_node("MatMul", [x, w1], [t("h")], name=t("up"))
        up.device_configurations.append(NodeConfig("tp", (column(w1),)).to_proto())
        down = helper.make_node("MatMul", [t("s"), w2], [t("o")], name=t("down"))
        down.device_configurations.append(NodeConfig("tp", (row(w2),)).to_proto())
        graph_nodes += [
            up,
            helper.make_node("Gelu", [t("h")], [t("a")], name=t("gelu")),
            helper.make_node("Mul", [t("a"), "half"], [t("s")], name=t("scale")),
            down,
            helper.make_node("Add", [t("o"), x], [t("r")], name=t("residual")),
            helper.make_node("LayerNormalization", [t("r"), "gamma"], [t("n")], name=t("norm")),
            helper.make_node("Reshape", [t("n"), "heads"], [t("v")], name=t("split_heads")),
            helper.make_node("Transpose", [t("v")], [t("p")], name=t("to_heads"), perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", [t("p")], [t("q")], name=t("from_heads"), perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [t("q"), "flat"], [t("y")], name=t("merge_heads")),
        ]
        x = t("y")
    graph = helper.make_graph(graph_nodes, "bench", inputs,
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.configuration.append(onnx.DeviceConfigurationProto(name="tp", num_devices=devices))
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model = synthetic(args.nodes, args.devices)
    times, cpu = [], []
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        result = infer(model)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    placed = sum(all(s is not None for s in n.outputs) for n in result.nodes.values())
    errors = len(result.errors())
    best = min(times)
    print(f"nodes: {len(model.graph.node)}  placed: {placed}  errors: {errors}")
    print(
        f"infer: {best:.3f} s wall, {min(cpu):.3f} s CPU (best of {args.repeat}; "
        f"{1e6 * best / len(model.graph.node):.1f} us/node)"
    )


if __name__ == "__main__":
    main()
