"""onnxruntime's MatMulNBits against its CPU kernel: 2, 4 and 8 bits, block sizes, K not a multiple of the block,
zero points absent, packed uint8 or float, bias; packed weights as initializers or as the program's inputs."""

import numpy as np
import onnxruntime as ort
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)


def _weights(k, n, bits, block_size, zero_points, bias):
    """MatMulNBits' inputs after A: packed B, scales, zero points (or None), g_idx (None), bias (or None)."""
    blocks = -(-k // block_size)
    b = RNG.integers(0, 256, (n, blocks, block_size * bits // 8)).astype(np.uint8)
    scales = (RNG.random(n * blocks) * 0.1 + 0.01).astype(np.float32) / (1 << (bits - 4) if bits > 4 else 1)
    zero = None
    if zero_points == "uint8":
        zero = RNG.integers(0, 256, n * (-(-blocks * bits // 8))).astype(np.uint8)
    elif zero_points == "float":
        zero = _f(n * blocks)
    return [b, scales, zero, None, _f(n) if bias else None]


def _check(a, weights, *, weights_as_inputs, **attrs):
    arrays = [a] + weights
    model, feeds = opcheck.single_node_model(
        "MatMulNBits", 1, arrays, inits=range(1, len(arrays)), trim=True, domain="com.microsoft", **attrs
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    if weights_as_inputs:  # the packed weights reach the program as runtime values
        model, feeds = opcheck.single_node_model("MatMulNBits", 1, arrays, trim=True, domain="com.microsoft", **attrs)
    actual = translate(model)(*feeds.values())
    opcheck.assert_outputs(expected, actual, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("zero_points", [None, "uint8", "float"])
@pytest.mark.parametrize("k,block_size", [(64, 16), (64, 32), (128, 64), (40, 16), (100, 32)])
def test_matmul_4_bits(zero_points, k, block_size):
    n = 12
    weights = _weights(k, n, 4, block_size, zero_points, bias=False)
    _check(_f(2, 3, k), weights, weights_as_inputs=False, K=k, N=n, bits=4, block_size=block_size)


@pytest.mark.parametrize("accuracy_level", [0, 1, 2, 3, 4])
@pytest.mark.parametrize(
    "k,block_size,bits", [(128, 32, 4), (100, 32, 4), (64, 16, 4), (256, 128, 4), (64, 16, 8), (64, 16, 2), (128, 32, 2)]
)
def test_matmul_accuracy_level(accuracy_level, k, block_size, bits):
    """Level 4 (the builder's choice for CPU) rounds the activations to int8 per block in onnxruntime's kernel."""
    n = 16
    weights = _weights(k, n, bits, block_size, "uint8", bias=False)
    _check(_f(3, k), weights, weights_as_inputs=False, K=k, N=n, bits=bits, block_size=block_size,
           accuracy_level=accuracy_level)


@pytest.mark.parametrize("bits", [2, 8])
def test_matmul_other_bits(bits):
    k, n, block_size = 64, 6, 16
    weights = _weights(k, n, bits, block_size, "uint8", bias=False)
    _check(_f(5, k), weights, weights_as_inputs=False, K=k, N=n, bits=bits, block_size=block_size)


@pytest.mark.parametrize("zero_points", [None, "uint8"])
def test_matmul_with_bias_weights_as_inputs(zero_points):
    k, n, block_size = 48, 10, 16
    weights = _weights(k, n, 4, block_size, zero_points, bias=True)
    _check(_f(1, 4, k), weights, weights_as_inputs=True, K=k, N=n, bits=4, block_size=block_size)


def test_packed_weights_stay_packed_in_the_program():
    """The program's input is the packed uint8 blob; no host-side unpacking makes a float weight of it. On CPU
    the int4 kernel reads it (no float [N, K] value in the program); traced portably (``jax.export``), the
    unpacking is shifts in the program."""
    import jax

    from onnx2jax.ops import nbits_kernel
    from onnx2jax.ops.contrib_quantization import matmul_nbits, portable

    k, n, block_size = 64, 8, 32
    b, scales, zero, _, _ = _weights(k, n, 4, block_size, "uint8", bias=False)

    def program(a, b):
        return matmul_nbits(a, b, scales, zero, K=k, N=n, block_size=block_size)

    with portable():
        jaxpr = jax.make_jaxpr(program)(_f(2, k), b)
    assert jaxpr.in_avals[1].dtype == np.uint8 and jaxpr.in_avals[1].shape == b.shape
    assert "shift_right_logical" in {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}
    if nbits_kernel.available():
        hlo = jax.jit(lambda a, b: program(a, b)).lower(_f(2, k), b).as_text()  # not the portable trace, cached
        assert nbits_kernel.TARGET in hlo
        assert f"tensor<{n}x{k}xf32>" not in hlo and f"tensor<{k}x{n}xf32>" not in hlo


def test_matmul_float16():
    k, n, block_size = 64, 8, 16
    b, scales, zero, _, _ = _weights(k, n, 4, block_size, "uint8", bias=False)
    a = _f(3, k, dtype=np.float16)
    model, feeds = opcheck.single_node_model(
        "MatMulNBits", 1, [a, b, scales.astype(np.float16), zero], inits=(1, 2, 3), domain="com.microsoft",
        K=k, N=n, bits=4, block_size=block_size,
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    opcheck.assert_outputs(expected, translate(model)(*feeds.values()), rtol=2e-3, atol=4e-3)


def _check_gather(arrays, inits, **attrs):
    model, feeds = opcheck.single_node_model(
        "GatherBlockQuantized", 1, arrays, inits=inits, trim=True, domain="com.microsoft", **attrs
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    opcheck.assert_outputs(expected, translate(model)(*feeds.values()), rtol=1e-6, atol=1e-6, compare="allclose")


@pytest.mark.parametrize("with_zero_points", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gather_block_quantized_uint8(bits, with_zero_points):
    """A builder's int4 embedding table: rows packed along the hidden axis; indices negative and out of range."""
    vocab, hidden, block_size = 10, 64, 16
    per_byte = 8 // bits
    data = RNG.integers(0, 256, (vocab, hidden // per_byte)).astype(np.uint8)
    scales = RNG.random((vocab, hidden // block_size)).astype(np.float32)
    zero = RNG.integers(0, 256, (vocab, -(-(hidden // block_size) // per_byte))).astype(np.uint8)
    indices = np.array([[0, 3, -1], [9, 2, 12]], np.int64)
    arrays = [data, indices, scales] + ([zero] if with_zero_points else [])
    _check_gather(arrays, inits=(0, 2, 3), bits=bits, block_size=block_size)


def test_gather_block_quantized_block_sizes_and_packed_table():
    """Block sizes 16 to 128 and an odd hidden width (a partial last block) against onnxruntime; the program keeps
    the table packed (its uint8 input, no float [vocab, hidden] buffer: only the gathered rows are unpacked)."""
    import jax

    from onnx2jax.ops.contrib_quantization import gather_block_quantized

    vocab, hidden = 50, 200
    indices = np.array([[0, 7, -1, 49]], np.int64)
    for block_size in (16, 32, 64, 128):
        blocks = -(-hidden // block_size)
        data = RNG.integers(0, 256, (vocab, hidden // 2)).astype(np.uint8)
        scales = RNG.random((vocab, blocks)).astype(np.float32)
        zero = RNG.integers(0, 256, (vocab, -(-blocks // 2))).astype(np.uint8)
        _check_gather([data, indices, scales, zero], inits=(0, 2, 3), bits=4, block_size=block_size)
    hlo = jax.jit(lambda d, i, s, z: gather_block_quantized(d, i, s, z, block_size=block_size)).lower(
        data, indices, scales, zero).compile().as_text()
    entry = hlo[hlo.index("\nENTRY"):]  # the program's buffers
    assert f"u8[{vocab},{hidden // 2}]" in entry and f"f32[1,4,{hidden}]" in entry  # the check below can fail
    assert f"f32[{vocab},{hidden}]" not in entry and f"u8[{vocab},{hidden}]" not in entry


@pytest.mark.parametrize("with_zero_points", [False, True])
@pytest.mark.parametrize("axes", [(0, 1), (0, 0), (1, 2)])  # (gather_axis, quantize_axis)
def test_gather_block_quantized_4_bit_types(with_zero_points, axes):
    import ml_dtypes

    gather_axis, quantize_axis = axes
    shape = (10, 64) if gather_axis == 0 else (3, 10, 64)
    blocks = list(shape)
    blocks[quantize_axis] = -(-shape[quantize_axis] // 16)
    data = RNG.integers(-8, 8, shape).astype(ml_dtypes.int4)
    scales = RNG.random(blocks).astype(np.float32)
    zero = RNG.integers(-8, 8, blocks).astype(ml_dtypes.int4)
    arrays = [data, np.array([[1], [4]], np.int64), scales] + ([zero] if with_zero_points else [])
    _check_gather(arrays, inits=(0, 2, 3), gather_axis=gather_axis, quantize_axis=quantize_axis, block_size=16)


def test_without_the_kernel_the_jax_path_runs_and_says_so_once(monkeypatch, capfd):
    """No compiler at install: the extension is missing, MatMulNBits dequantizes in JAX (still onnxruntime's
    values) and one line on stderr says so and what it costs, once per process."""
    import functools

    from onnx2jax.ops import nbits_kernel

    monkeypatch.setattr(nbits_kernel, "_load", lambda: "ImportError: no module named _matmul_nbits")
    monkeypatch.setattr(nbits_kernel, "_noted", functools.cache(nbits_kernel._noted.__wrapped__))
    k, n, block_size = 64, 12, 32
    for _ in range(2):
        weights = _weights(k, n, 4, block_size, "uint8", bias=False)
        _check(_f(2, k), weights, weights_as_inputs=False, K=k, N=n, bits=4, block_size=block_size)
    notes = [line for line in capfd.readouterr().err.splitlines() if "int4 CPU kernel was not built" in line]
    assert len(notes) == 1 and "dequantizes every weight" in notes[0] and "_matmul_nbits" in notes[0], notes
