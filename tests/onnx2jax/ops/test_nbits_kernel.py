"""The int4 CPU kernel (onnx2jax/_native/matmul_nbits.cc) against onnxruntime's MatMulNBits, node by node.

Block sizes 16/32/64/128, zero points absent, packed uint8 or float, K not a multiple of the block (odd K),
N not a multiple of anything the kernel tiles by (its row chunks, 4-row groups of A, 32-value SIMD steps),
one row (decode), a few, and 128 (a prompt), every accuracy_level; the kernel's loops at each cap (AVX512-VNNI,
AVX2, plain C++; on a CPU without them the capped runs take the loops it has).
Tolerances: levels 0-3 (float compute: onnxruntime dequantizes to float and runs its SGEMM, we add in
another order) within 2e-6 relative to the largest |y| of the product; level 4 (A rounded to int8 per block
with MLAS's own float operations, so to the same integers; integer block dots, exact) within 1e-6 of it: the
float sums of block products in another order.
Each case draws its data from a generator seeded by its own parameters, so that a case run alone (``-k``)
sees the data it sees in the whole file.
"""

import numpy as np
import onnxruntime as ort
import pytest

import opcheck
from onnx2jax.ops import nbits_kernel

pytestmark = pytest.mark.skipif(
    not nbits_kernel.available(), reason="the int4 kernel was not built (no compiler at install)"
)

TOLERANCE = {0: 2e-6, 1: 2e-6, 2: 2e-6, 3: 2e-6, 4: 1e-6}
ZERO_POINTS = (None, "uint8", "float")


def _case(m, k, n, block_size, zero_points, seed=30):
    """A, packed B, scales and zero points drawn from a generator seeded by the case itself."""
    rng = np.random.default_rng([seed, m, k, n, block_size, ZERO_POINTS.index(zero_points)])
    blocks = -(-k // block_size)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.integers(0, 256, (n, blocks, block_size // 2)).astype(np.uint8)
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zero = None
    if zero_points == "uint8":
        zero = rng.integers(0, 256, (n, -(-blocks // 2))).astype(np.uint8)
    elif zero_points == "float":
        zero = rng.standard_normal((n, blocks)).astype(np.float32)
    return a, b, scales, zero


def _onnxruntime(a, b, scales, zero, *, k, n, block_size, accuracy_level):
    model, feeds = opcheck.single_node_model(
        "MatMulNBits", 1, [a, b, scales.reshape(-1), None if zero is None else zero.reshape(-1)],
        inits=(1, 2, 3), trim=True, domain="com.microsoft", K=k, N=n, bits=4, block_size=block_size,
        accuracy_level=accuracy_level,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _kernel(a, b, scales, zero, *, block_size, accuracy_level, simd):
    import jax

    accuracy = 4 if accuracy_level == 4 else 0
    run = jax.jit(lambda a, b, s, z: nbits_kernel.product(a, b, s, z, block_size=block_size, accuracy=accuracy,
                                                         simd=simd))
    return np.asarray(run(a, b, scales, zero))


def _check(a, b, scales, zero, accuracy_level, simd=2):
    m, k, n, block_size = a.shape[0], a.shape[1], b.shape[0], 2 * b.shape[2]
    expected = _onnxruntime(a, b, scales, zero, k=k, n=n, block_size=block_size, accuracy_level=accuracy_level)
    actual = _kernel(a, b, scales, zero, block_size=block_size, accuracy_level=accuracy_level, simd=simd)
    assert actual.shape == expected.shape == (m, n)
    error = np.abs(actual.astype(np.float64) - expected).max() / np.abs(expected).max()
    assert error <= TOLERANCE[accuracy_level], (error, TOLERANCE[accuracy_level])


def _compare(m, k, n, block_size, zero_points, accuracy_level, simd=2, seed=30):
    _check(*_case(m, k, n, block_size, zero_points, seed), accuracy_level, simd)


SIMD = {2: "vnni", 1: "avx2", 0: "plain"}


def _grid():
    """Every block size x level x zero points, each at every SIMD cap. The default run takes each combination
    at one cap, the caps in turn (each cap still meets every block size, level and zero-point kind); the other
    two thirds run with ``-m slow``."""
    index = 0
    for block_size in (16, 32, 64, 128):
        for accuracy_level in range(5):
            for zero_points in (None, "uint8"):
                for simd in SIMD:
                    marks = [] if simd == (2, 1, 0)[index % 3] else [pytest.mark.slow]
                    yield pytest.param(block_size, accuracy_level, zero_points, simd, marks=marks,
                                       id=f"{block_size}-{accuracy_level}-{zero_points}-{SIMD[simd]}")
                index += 1


@pytest.mark.parametrize("block_size,accuracy_level,zero_points,simd", list(_grid()))
def test_block_sizes_levels_and_zero_points(block_size, accuracy_level, zero_points, simd):
    """One row (decode) and three, K a few blocks and a partial one, N = 37 (no tile divides it)."""
    k = 3 * block_size + 7
    for m in (1, 3):
        _compare(m, k, 37, block_size, zero_points, accuracy_level, simd)


@pytest.mark.parametrize("accuracy_level", [0, 4])
@pytest.mark.parametrize("k,block_size", [(257, 32), (48, 16), (1023, 128), (64, 64)])
def test_prompt_rows(k, block_size, accuracy_level):
    """128 rows of A (a prompt's prefill) against 75 outputs; odd K."""
    _compare(128, k, 75, block_size, "uint8", accuracy_level)


@pytest.mark.parametrize("simd", [2, 1, 0], ids=["vnni", "avx2", "plain"])
@pytest.mark.parametrize("block_size", [16, 32])
def test_float_zero_points(block_size, simd):
    """Zero points in the scales' float type (float compute: the kernel is not used for them at level 4)."""
    _compare(5, 5 * block_size - 3, 19, block_size, "float", 0, simd)


def test_wide_product_runs_on_several_threads():
    """A product large enough that its rows are split in chunks over XLA's intra-op threads."""
    _compare(2, 1024, 1408, 32, "uint8", 4)
    _compare(2, 1024, 1408, 32, None, 0)


@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_few_rows_whole_groups_of_128(block_size):
    """Float compute, a few rows, K a multiple of 128 (the loop that reads B's bytes as 32-bit lanes): 6 rows
    (pairs of rows of A), N = 39 and 38 (4-row tiles and a tail of 3 or 2), zero points packed and absent."""
    for zero_points, n in (("uint8", 39), (None, 38)):
        _compare(6, 384, n, block_size, zero_points, 1)


def _rounding_tie():
    """One block of 32 whose largest |a| is 2.951391 and whose a[1] = 0.034858946: MLAS multiplies a[1] by
    127 / 2.951391 and gets 1.5 exactly, which rounds (half to even) to 2; by 1 / (2.951391 / 127), one bit
    apart, it gets 1.4999998, which rounds to 1. B's value meeting a[1] is 3 - 8, so the two roundings put
    y apart by ~1e-2 of its largest value."""
    rng = np.random.default_rng(31)
    a = (rng.random((1, 32)) - 0.5).astype(np.float32)
    a[0, 0], a[0, 1] = np.float32(2.951391), np.float32(0.034858946)
    scale = np.float32(2.951391) / np.float32(127)
    assert np.float32(a[0, 1] * (np.float32(127) / a[0, 0])) == 1.5  # the tie MLAS rounds
    assert np.float32(a[0, 1] * (np.float32(1) / scale)) < 1.5  # and the other inverse does not reach it
    b = rng.integers(0, 256, (7, 1, 16)).astype(np.uint8)
    b[:, 0, 0] = 0x30 | (b[:, 0, 0] & 0x0F)  # a[1] meets the high nibble of byte 0: 3
    scales = (rng.random((7, 1)) * 0.1 + 0.01).astype(np.float32)
    return a, b, scales


@pytest.mark.parametrize("simd", [2, 1, 0], ids=["vnni", "avx2", "plain"])
def test_int8_rounding_matches_onnxruntime_at_a_tie(simd):
    """Level 4 rounds each block of A with MLAS's operations (a * (127 / max|a|), half to even), so a value
    that lands on a half rounds as onnxruntime rounds it."""
    a, b, scales = _rounding_tie()
    _check(a, b, scales, None, 4, simd)


def test_int8_rounding_tie_on_the_pure_jax_path():
    """The pure-JAX path (no kernel: GPU, ``jax.export``) rounds A the same way."""
    import jax

    from onnx2jax.ops.contrib_quantization import matmul_nbits, portable

    a, b, scales = _rounding_tie()
    expected = _onnxruntime(a, b, scales, None, k=32, n=7, block_size=32, accuracy_level=4)
    with portable():
        actual = jax.jit(lambda a, b, s: matmul_nbits(a, b, s, K=32, N=7, block_size=32, accuracy_level=4))(
            a, b, scales.reshape(-1))
    error = np.abs(np.asarray(actual, np.float64) - expected).max() / np.abs(expected).max()
    assert error <= TOLERANCE[4], error


@pytest.mark.slow
@pytest.mark.parametrize("k,block_size", [(1023, 128), (257, 32), (48, 16), (200, 64)])
def test_int8_compute_over_many_seeds(k, block_size):
    """Level 4 over 100 seeds a shape (1 and 128 rows, zero points packed and absent): before A was rounded
    with MLAS's 127 / max, 7 of 40 seeds of the [128, 1023] prompt failed by 3e-4."""
    for seed in range(100):
        for m, zero_points in ((1, None), (128, "uint8")):
            _compare(m, k, 75, block_size, zero_points, 4, seed=seed)
