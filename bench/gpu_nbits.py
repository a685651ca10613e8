"""MatMulNBits' pure-JAX path on a GPU (issue 30): one int4 product against the fp32 dot of the same
(dequantized) weight, and whether the compiled program writes a float copy of the weight (a float
``[N, K]`` value in its entry computation, not inside a fusion).

    python bench/gpu_nbits.py   # with a CUDA jax; prints a markdown table

Measured once on an H200 (bench/RESULTS.md, "int4, fourth pass").
"""

from __future__ import annotations

import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.contrib_quantization import dequantize_nbits, matmul_nbits

SHAPES = ((1, 1024, 2816), (1, 2816, 1024), (1, 4096, 14336), (128, 1024, 2816), (128, 4096, 14336))
"""(rows of A, K, N): decode and a 128-token prompt at the real-width fixture's and at an 8B model's sizes."""


def _median_ms(fn, *args, repeats: int = 50) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}")
    print("| product | int4 ms | fp32 dot ms | int4 / fp32 | float weight written | max error / max \\|y\\| |")
    print("|---|---|---|---|---|---|")
    block = 32
    for m, k, n in SHAPES:
        b = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
        scales = (rng.random(n * k // block) * 0.1 + 0.01).astype(np.float32)
        a = rng.standard_normal((m, k)).astype(np.float32)
        a, b, scales = jax.device_put(a), jax.device_put(b), jax.device_put(scales)
        int4 = jax.jit(lambda a, b, s: matmul_nbits(a, b, s, K=k, N=n, block_size=block, bits=4))
        w = jax.jit(lambda b, s: dequantize_nbits(b, s, None, K=k, N=n, bits=4, block_size=block))(b, scales)
        fp32 = jax.jit(lambda a, w: jnp.matmul(a, w.T, precision=jax.lax.Precision.HIGHEST))
        text = int4.lower(a, b, scales).compile().as_text()
        entry = text[text.index("ENTRY"):]
        written = any(re.search(rf"= f32\[{n},{k}\]|= f32\[{n},{k // block},{block // 2},2\]", line)
                      for line in entry.splitlines())
        t4, t32 = _median_ms(int4, a, b, scales), _median_ms(fp32, a, w)
        y = np.asarray(int4(a, b, scales), np.float64)
        ref = np.asarray(a, np.float64) @ np.asarray(w, np.float64).T
        error = np.abs(y - ref).max() / np.abs(ref).max()
        print(f"| [{m}, {k}] x [{n}, {k}] | {t4:.3f} | {t32:.3f} | {t4 / t32:.2f} | {'yes' if written else 'no'} "
              f"| {error:.1e} |")


if __name__ == "__main__":
    main()
