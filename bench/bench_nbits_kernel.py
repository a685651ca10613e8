"""One MatMulNBits product, the int4 kernel against onnxruntime's node, per CPU second (issue 30).

``python bench/bench_nbits_kernel.py [--rows 1 128] [--repeats N]``: for each shape (N x K of the real-width
build's FFN, block 32) and row count, times the kernel (``nbits_kernel.product`` under jit, at each ``simd``
cap) and onnxruntime's MatMulNBits node (accuracy_level 4 and 1, MLAS), alternating them round by round in
one process, and prints CPU ms per product (process time over the round, both runtimes using 2 threads).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx2jax.ops import nbits_kernel

BLOCK = 32


def _session(b, scales, k, n, accuracy_level):
    nodes = [helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft", K=k, N=n,
                              bits=4, block_size=BLOCK, accuracy_level=accuracy_level)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
        [onnx.numpy_helper.from_array(b, "B"), onnx.numpy_helper.from_array(scales.reshape(-1), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _cpu(fn, repeats):
    fn()
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--repeats", type=int, default=0, help="products a round (0: about 2 G weights)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--simd", type=int, nargs="+", default=[2, 1])
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    for n, k in ((2816, 1024), (1024, 2816)):
        blocks = k // BLOCK
        b = rng.integers(0, 256, (n, blocks, BLOCK // 2)).astype(np.uint8)
        scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
        for m in args.rows:
            a = rng.standard_normal((m, k)).astype(np.float32)
            repeats = args.repeats or max(3, int(2e8 / (m * n * k) * 10))
            runs = {}
            for accuracy in (4, 0):
                for simd in args.simd:
                    fn = jax.jit(lambda a, b, s, acc=accuracy, simd=simd: nbits_kernel.product(
                        a, b, s, None, block_size=BLOCK, accuracy=acc, simd=simd))
                    ja, jb, js = jax.device_put(a), jax.device_put(b), jax.device_put(scales)
                    runs[f"ours acc{accuracy} simd{simd}"] = lambda fn=fn, ja=ja, jb=jb, js=js: fn(ja, jb, js).block_until_ready()
                session = _session(b, scales, k, n, 4 if accuracy == 4 else 1)
                runs[f"ort acc{4 if accuracy == 4 else 1}"] = lambda s=session, a=a: s.run(None, {"A": a})
            times = {name: [] for name in runs}
            for _ in range(args.rounds):
                for name, fn in runs.items():
                    times[name].append(_cpu(fn, repeats))
            print(f"[{m}, {k}] x [{n}, {k}]^T, block {BLOCK}, {repeats} products a round, CPU ms (median of {args.rounds}):")
            for name, values in times.items():
                print(f"  {name:18s} {np.median(values):8.3f}   ({' '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
    main()
