"""An If whose branches return different shapes, on a condition computed at run time, against onnxruntime."""

from __future__ import annotations

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import onnx2jax
from onnx2jax.errors import NodeError

from onnxruntime_reference import onnxruntime_outputs

F = onnx.TensorProto.FLOAT
I64 = onnx.TensorProto.INT64


def _branch(name: str, length: int, op: str, operand: str, extra: list[onnx.NodeProto] = ()) -> onnx.GraphProto:
    """``op(x[:length], operand)``: x, ``operand`` and, in the else branch, ``w`` and ``start`` come from outside."""
    nodes = [
        oh.make_node("Constant", [], [f"{name}_start"], value=oh.make_tensor(f"{name}_s", I64, [1], [0])),
        oh.make_node("Constant", [], [f"{name}_end"], value=oh.make_tensor(f"{name}_e", I64, [1], [length])),
        oh.make_node("Slice", ["x", f"{name}_start", f"{name}_end"], [f"{name}_slice"]),
        *extra,
        oh.make_node(op, [f"{name}_slice", operand], [f"{name}_out"]),
    ]
    return oh.make_graph(nodes, name, [], [oh.make_tensor_value_info(f"{name}_out", F, [None])])


def if_model(then_length: int = 3, else_length: int = 5, x_shape: list = ("n",)) -> onnx.ModelProto:
    """cond = sum(x) > 0 (computed); then: x[:3] * 2, else: x[:5] + w[:5]; then squares and a sum after the If.

    With a symbolic ``x_shape`` ONNX shape inference cannot tell the branch
    lengths; with a fixed one it can.
    """
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["total_x"], keepdims=0, name="sum_x"),
        oh.make_node("Greater", ["total_x", "zero"], ["cond"], name="positive"),
        oh.make_node(
            "If", ["cond"], ["picked"], name="pick",
            then_branch=_branch("then", then_length, "Mul", "two"),
            else_branch=_branch(
                "else", else_length, "Add", "w_head",
                [oh.make_node("Slice", ["w", "start", "else_end"], ["w_head"])],
            ),
        ),
        oh.make_node("Mul", ["picked", "picked"], ["squared"], name="square"),
        oh.make_node("ReduceSum", ["squared"], ["total"], keepdims=0, name="sum"),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        onnx.numpy_helper.from_array(np.array([0], np.int64), "start"),
        onnx.numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "w"),
    ]
    graph = oh.make_graph(
        nodes, "if_shapes", [oh.make_tensor_value_info("x", F, list(x_shape))],
        [oh.make_tensor_value_info("squared", F, [None]), oh.make_tensor_value_info("total", F, [])], inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("x_shape", [["n"], [8]])
@pytest.mark.parametrize("sign, length", [(1.0, 3), (-1.0, 5)])
def test_both_branches_equal_onnxruntime(x_shape: list, sign: float, length: int) -> None:
    model = if_model(x_shape=x_shape)
    translated = onnx2jax.translate(model)
    for n in (8, 11) if x_shape == ["n"] else (8, 8):  # two input shapes: each compiled once per shape
        x = sign * np.linspace(0.5, 2.0, n).astype(np.float32)
        expected = onnxruntime_outputs(model, {"x": x})
        actual = translated(x)
        assert np.asarray(actual[0]).shape == (length,)
        for e, a in zip(expected, actual):
            np.testing.assert_allclose(np.asarray(a), e, rtol=1e-6)


def test_the_if_is_a_host_step_between_jitted_segments() -> None:
    # Branch lengths that shape inference knows (3 and 5 of a fixed 8): cut before any call.
    translated = onnx2jax.translate(if_model(x_shape=[8]))
    assert [s.kind for s in translated.segments] == ["jit", "host", "jit"]
    host = translated.segments[1]
    assert host.nodes == ("pick",)
    assert "branches return outputs of different shapes" in host.reason


def test_an_if_whose_branches_agree_stays_one_program() -> None:
    model = if_model(then_length=4, else_length=4)
    translated = onnx2jax.translate(model)
    assert translated.segments == []
    for sign in (1.0, -1.0):
        x = sign * np.linspace(0.5, 2.0, 8).astype(np.float32)
        for e, a in zip(onnxruntime_outputs(model, {"x": x}), translated(x)):
            np.testing.assert_allclose(np.asarray(a), e, rtol=1e-6)
    with jax.enable_x64(True):  # the model has int64 constants
        jax.jit(translated.fn)(translated.params, np.ones(8, np.float32))  # one traceable function


def test_unknown_branch_lengths_are_cut_when_tracing_finds_them() -> None:
    # x[:3] and x[:5] of a symbolic n: shape inference cannot tell, so the first call's trace finds out.
    translated = onnx2jax.translate(if_model())
    assert translated.segments == []
    translated(np.ones(8, np.float32))
    assert [s.kind for s in translated.segments] == ["jit", "host", "jit"]


@pytest.mark.parametrize("x_shape", [["n"], [8]])
def test_tracing_names_the_if(x_shape: list) -> None:
    translated = onnx2jax.translate(if_model(x_shape=x_shape))
    with jax.enable_x64(True), pytest.raises(
        NodeError, match="'pick'.*(branches return outputs of different shapes|both branches must)"
    ):
        jax.jit(translated.fn)(translated.params, np.ones(8, np.float32))


def test_if_nested_in_a_branch_is_cut_in_the_branch_model() -> None:
    # The outer If's condition is a graph input; its then branch holds the computed-condition If.
    inner = if_model()
    outer_then = oh.make_graph(list(inner.graph.node), "outer_then", [], [oh.make_tensor_value_info("squared", F, None)])
    outer_else = oh.make_graph([oh.make_node("Neg", ["x"], ["negated"])], "outer_else", [],
                               [oh.make_tensor_value_info("negated", F, None)])
    graph = oh.make_graph(
        [oh.make_node("If", ["flag"], ["out"], then_branch=outer_then, else_branch=outer_else, name="outer")],
        "nested", [oh.make_tensor_value_info("flag", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("x", F, ["n"])],
        [oh.make_tensor_value_info("out", F, None)], list(inner.graph.initializer),
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21)], ir_version=10)
    translated = onnx2jax.translate(model)
    for flag in (True, False):
        for sign in (1.0, -1.0):
            x = sign * np.linspace(0.5, 2.0, 8).astype(np.float32)
            (expected,) = onnxruntime_outputs(model, {"flag": np.array(flag), "x": x})
            (actual,) = translated(np.array(flag), x)
            np.testing.assert_allclose(np.asarray(actual), expected, rtol=1e-6)
