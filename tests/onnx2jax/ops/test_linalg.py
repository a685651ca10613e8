"""MatMul, Gemm, Einsum, Det against onnxruntime, over the opsets they are registered for."""

import functools

import numpy as np
import pytest

import opcheck

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


@pytest.mark.parametrize("opset", [9, 13])
@pytest.mark.parametrize(
    "shapes",
    [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (5, 4, 6)), ((4,), (4, 5)), ((2, 3, 4), (4,)), ((4,), (4,))],
)
def test_matmul(opset, shapes):
    check("MatMul", opset, [_f(*shapes[0]), _f(*shapes[1])])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float64])
def test_matmul_dtypes(dtype):
    a = RNG.integers(-5, 5, (2, 3, 4)).astype(dtype)
    b = RNG.integers(-5, 5, (4, 6)).astype(dtype)
    check("MatMul", 13, [a, b], rtol=0, atol=0)


def test_matmul_float32_is_full_precision():
    # Values that bf16-pass matmuls would visibly round: the sum must match float64 closely.
    a = (1 + RNG.random((8, 256))).astype(np.float32)
    b = (1 + RNG.random((256, 8))).astype(np.float32)
    check("MatMul", 13, [a, b], rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    "opset,trans_a,trans_b,c_shape",
    [
        (7, 0, 0, (5,)),
        (7, 1, 1, (3, 5)),
        (9, 1, 0, (1, 5)),
        (9, 0, 1, (3, 1)),
        (11, 0, 1, ()),
        (11, 1, 1, (5,)),
        (13, 0, 0, (3, 5)),
        (13, 1, 0, (3, 1)),
        (13, 0, 1, (1, 5)),
    ],
)
def test_gemm(opset, trans_a, trans_b, c_shape):
    a = _f(4, 3) if trans_a else _f(3, 4)
    b = _f(5, 4) if trans_b else _f(4, 5)
    check("Gemm", opset, [a, b, _f(*c_shape)], transA=trans_a, transB=trans_b, alpha=0.5, beta=2.0)


@pytest.mark.parametrize("opset", [11, 13])
def test_gemm_without_c(opset):
    check("Gemm", opset, [_f(3, 4), _f(5, 4)], transB=1, alpha=1.5)


@pytest.mark.parametrize(
    "equation,shapes",
    [
        ("ij,jk->ik", [(3, 4), (4, 5)]),
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
        ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
        ("ii->i", [(4, 4)]),
        ("ij->", [(3, 4)]),
        ("i,j->ij", [(3,), (4,)]),
        ("...ij,...jk", [(2, 3, 4), (2, 4, 5)]),
        ("ij, jk -> ik", [(3, 4), (4, 5)]),
    ],
)
def test_einsum(equation, shapes):
    check("Einsum", 12, [_f(*s) for s in shapes], equation=equation)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4)])
def test_det(shape):
    check("Det", 11, [_f(*shape)], rtol=1e-4)
