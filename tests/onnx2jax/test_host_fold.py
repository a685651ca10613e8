"""onnx2jax.host_fold: numpy folds equal the jax implementations, and a GPT-2-style mask compiles no eager op."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnx2jax
from onnx2jax import host_fold
from onnx2jax.graph_runner import _resolve, node_attributes

RNG = np.random.default_rng(0)
INTS = [np.int32, np.int64, np.uint8]


def _jax_result(op_type: str, inputs: list, attrs: dict, opset: int = 18) -> np.ndarray:
    impl = _resolve("", op_type, opset)
    node = helper.make_node(op_type, [f"i{k}" for k in range(len(inputs))], ["o"], **attrs)
    full = node_attributes(node, "", opset)
    with jax.enable_x64(True), jax.ensure_compile_time_eval():
        return np.asarray(impl.fn(*inputs, **full)), full


def _check(op_type: str, inputs: list, attrs: dict | None = None, opset: int = 18) -> None:
    expected, full = _jax_result(op_type, inputs, attrs or {}, opset)
    got = host_fold.fold("", op_type, inputs, full)
    assert got is not None, f"{op_type} not folded"
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Max", "Min", "Equal", "Less", "LessOrEqual", "Greater",
                                "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", INTS)
def test_binary_integer_ops_equal_jax(op, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)  # overflow wraps in both
    b = RNG.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    _check(op, [a, b])
    _check(op, [np.asarray(a[0, 0]), np.asarray(b[1])])  # 0-d


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic_ops_equal_jax(op):
    _check(op, [RNG.random((2, 5)) > 0.5, RNG.random((5,)) > 0.5])
    _check("Not", [RNG.random((2, 5)) > 0.5])


def test_where_gather_nd_cum_sum_cast_equal_jax():
    cond = RNG.random((4, 4)) > 0.5
    _check("Where", [cond, np.float32(-np.inf) * np.ones((4, 4), np.float32), np.zeros((1, 4), np.float32)])
    x = RNG.integers(-9, 9, (2, 3, 4), dtype=np.int64)
    _check("GatherND", [x, np.array([[0, -1], [1, 2]], np.int64)], {"batch_dims": 0})
    _check("GatherND", [x, np.array([[[2], [-3]], [[0], [1]]], np.int64)], {"batch_dims": 1})
    for exclusive in (0, 1):
        for reverse in (0, 1):
            _check("CumSum", [x, np.array(-1, np.int64)], {"exclusive": exclusive, "reverse": reverse})
    for to in (TensorProto.FLOAT, TensorProto.INT32, TensorProto.BOOL, TensorProto.FLOAT16):
        _check("Cast", [x * 123457], {"to": to})
        _check("Cast", [x > 0], {"to": to})


def test_floats_out_of_range_and_legacy_forms_are_left_to_jax():
    f = np.ones((2,), np.float32)
    assert host_fold.fold("", "Add", [f, f], {}) is None
    assert host_fold.fold("", "Add", [np.ones(2, np.int64)] * 2, {"broadcast": 0}) is None
    assert host_fold.fold("", "GatherND", [np.ones((2, 2), np.int64), np.array([[5]])], {"batch_dims": 0}) is None
    assert host_fold.fold("", "Cast", [f], {"to": TensorProto.INT32}) is None
    assert host_fold.fold("com.microsoft", "Add", [np.ones(2, np.int64)] * 2, {}) is None


@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64")  # jax's own narrowing, the point here
def test_without_x64_a_cast_to_int64_folds_through_jax_as_before():
    """jax narrows 64-bit results when x64 is off; the host fold must not give a wider dtype than jax."""
    from onnx2jax.graph_runner import GraphRunner

    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64)
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.INT64, [3])])
    env = {"x": np.arange(3, dtype=np.int32)}
    with jax.enable_x64(False):
        (y,) = GraphRunner({"": 18}).run(graph, env)
    assert isinstance(y, np.ndarray) and y.dtype == np.int32 and y.tolist() == [0, 1, 2]


def test_causal_mask_folds_without_eager_compiles(tmp_path):
    """A torch-style mask (CumSum of ones, LessOrEqual, GatherND, Not, Where) compiles one program."""
    n = 8
    const = lambda name, value: helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(value))  # noqa: E731
    nodes = [
        const("ones", np.ones((n, n), np.int64)),
        const("ax", np.array(1, np.int64)),
        helper.make_node("CumSum", ["ones", "ax"], ["cols"]),
        const("ax0", np.array(0, np.int64)),
        helper.make_node("CumSum", ["ones", "ax0"], ["rows"]),
        helper.make_node("LessOrEqual", ["cols", "rows"], ["keep"]),
        const("idx", np.arange(n, dtype=np.int64).reshape(n, 1)),
        helper.make_node("GatherND", ["keep", "idx"], ["picked"]),
        helper.make_node("Not", ["picked"], ["drop"]),
        const("neg", np.array(-1e9, np.float32)),
        const("zero", np.array(0, np.float32)),
        helper.make_node("Where", ["drop", "neg", "zero"], ["bias"]),
        helper.make_node("Add", ["x", "bias"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "mask", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, n])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / "mask.onnx"
    onnx.save(model, path)
    x = RNG.standard_normal((n, n)).astype(np.float32)
    expected = x + np.where(np.tril(np.ones((n, n), bool)), 0, -1e9).astype(np.float32)
    compiles = []
    from jax._src import compiler

    # compile_or_get_cached is where every XLA program a call needs is obtained: compiled, or loaded from
    # the persistent compilation cache (which an earlier test may have filled), so each counts once.
    original = compiler.compile_or_get_cached

    def counting(*args, **kwargs):
        compiles.append(1)
        return original(*args, **kwargs)

    compiled = onnx2jax.compile(str(path))
    compiler.compile_or_get_cached = counting
    try:
        (y,) = compiled(x=x)
    finally:
        compiler.compile_or_get_cached = original
    np.testing.assert_array_equal(np.asarray(y), expected)
    assert len(compiles) == 1  # the model's own program: the mask folded on the host
