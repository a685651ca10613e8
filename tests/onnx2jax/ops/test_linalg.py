"""MatMul, Gemm, Einsum, Det against onnxruntime, over the opsets they are registered for."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _model(op, arrays, consts, opset, attrs, n_out, domain=""):
    """One ``op`` node; inputs at ``consts`` positions are Constant nodes (static), the rest graph inputs."""
    names = [f"x{i}" if a is not None else "" for i, a in enumerate(arrays)]
    nodes = [
        oh.make_node("Constant", [], [n], value=onnx.numpy_helper.from_array(np.asarray(a), n))
        for i, (n, a) in enumerate(zip(names, arrays))
        if a is not None and i in consts
    ]
    feeds = {n: a for i, (n, a) in enumerate(zip(names, arrays)) if a is not None and i not in consts}
    outputs = [f"y{i}" for i in range(n_out)]
    nodes.append(oh.make_node(op, names, outputs, domain=domain, **attrs))
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [oh.make_empty_tensor_value_info(o) for o in outputs],
    )
    opsets = [oh.make_opsetid("", opset)] if not domain else [oh.make_opsetid("", 26), oh.make_opsetid(domain, opset)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=10), feeds


def check(op, opset, arrays, *, consts=(), n_out=1, rtol=1e-5, atol=1e-5, oracle="ort", **attrs):
    """``op`` through onnx2jax and an oracle (onnxruntime, or ONNX's reference evaluator): same dtypes, shapes, values."""
    model, feeds = _model(op, arrays, set(consts), opset, attrs, n_out)
    if oracle == "ort":
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        expected = session.run(None, feeds)
    else:
        expected = ReferenceEvaluator(model).run(None, feeds)
    for info, e in zip(model.graph.output, expected):  # typed outputs, as exporters write them
        e = np.asarray(e)
        info.CopyFrom(oh.make_tensor_value_info(info.name, oh.np_dtype_to_tensor_dtype(e.dtype), e.shape))
    actual = translate(model)(*feeds.values())
    assert len(actual) >= len(expected)
    for e, a in zip(expected, actual):
        e, a = np.asarray(e), np.asarray(a)
        assert (a.dtype, a.shape) == (e.dtype, e.shape)
        np.testing.assert_allclose(a.astype(np.float64), e.astype(np.float64), rtol=rtol, atol=atol)


def _f(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


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
