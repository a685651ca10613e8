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
    """The program's input is the packed uint8 blob; no host-side unpacking makes a float weight of it."""
    import jax

    from onnx2jax.ops.contrib_quantization import matmul_nbits

    k, n, block_size = 64, 8, 32
    b, scales, zero, _, _ = _weights(k, n, 4, block_size, "uint8", bias=False)
    jaxpr = jax.make_jaxpr(lambda a, b: matmul_nbits(a, b, scales, zero, K=k, N=n, block_size=block_size))(_f(2, k), b)
    assert jaxpr.in_avals[1].dtype == np.uint8 and jaxpr.in_avals[1].shape == b.shape
    assert "shift_right_logical" in {eqn.primitive.name for eqn in jaxpr.jaxpr.eqns}


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
