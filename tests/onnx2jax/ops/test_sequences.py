"""Sequence and optional ops against onnxruntime, including sequence graph inputs and outputs."""

import functools

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import opcheck
from onnx2jax.errors import NodeError
from onnx2jax.translate import translate

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)


# Sequence outputs are lists, compared element by element.
_check = functools.partial(opcheck.check_model, rtol=1e-6, atol=0, compare="allclose")


def _seq_out(name):
    return oh.make_tensor_sequence_value_info(name, F, None)


@pytest.mark.parametrize("position", [None, 0, -1, 2])
def test_construct_insert_erase_at_length(position):
    pos = [] if position is None else [onh.from_array(np.array(position, np.int64), "pos")]
    p = "pos" if pos else ""
    nodes = [
        oh.make_node("SequenceConstruct", ["a", "b"], ["s"]),
        oh.make_node("SequenceInsert", ["s", "c", p], ["s2"]),
        oh.make_node("SequenceAt", ["s2", "one"], ["second"]),
        oh.make_node("SequenceLength", ["s2"], ["n"]),
        oh.make_node("SequenceErase", ["s2", p], ["s3"]),
    ]
    inits = pos + [onh.from_array(np.array(1, np.int64), "one")]
    inputs = [oh.make_tensor_value_info(n, F, [2, 3]) for n in "abc"]
    outputs = [_seq_out("s2"), oh.make_tensor_value_info("second", F, None), oh.make_tensor_value_info("n", I64, []),
               _seq_out("s3")]
    feeds = {n: RNG.standard_normal((2, 3)).astype(np.float32) for n in "abc"}
    _check(_model(nodes, inputs, outputs, inits), feeds)


@pytest.mark.parametrize("axis,new_axis", [(0, 0), (1, 0), (0, 1), (-1, 1)])
def test_concat_from_sequence(axis, new_axis):
    nodes = [
        oh.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
        oh.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis),
    ]
    inputs = [oh.make_tensor_value_info(n, F, [2, 3]) for n in "abc"]
    feeds = {n: RNG.standard_normal((2, 3)).astype(np.float32) for n in "abc"}
    _check(_model(nodes, inputs, [oh.make_tensor_value_info("y", F, None)]), feeds)


@pytest.mark.parametrize(
    "split,keepdims", [(None, 1), (None, 0), (np.array(2, np.int64), 1), (np.array([1, 4], np.int64), 1)]
)
def test_split_to_sequence(split, keepdims):
    inits = [] if split is None else [onh.from_array(split, "split")]
    node = oh.make_node("SplitToSequence", ["x"] + (["split"] if inits else []), ["s"], axis=1, keepdims=keepdims)
    model = _model([node], [oh.make_tensor_value_info("x", F, [3, 5])], [_seq_out("s")], inits)
    _check(model, {"x": RNG.standard_normal((3, 5)).astype(np.float32)})


def test_sequence_graph_input_and_sequence_map():
    body = oh.make_graph(
        [oh.make_node("Add", ["e", "t"], ["o"])],
        "body",
        [oh.make_tensor_value_info("e", F, None), oh.make_tensor_value_info("t", F, None)],
        [oh.make_tensor_value_info("o", F, None)],
    )
    node = oh.make_node("SequenceMap", ["s", "t"], ["r"], body=body)
    model = _model([node], [oh.make_tensor_sequence_value_info("s", F, None), oh.make_tensor_value_info("t", F, [3])],
                   [_seq_out("r")])
    seq = [RNG.standard_normal(3).astype(np.float32) for _ in range(3)]
    _check(model, {"s": seq, "t": np.ones(3, np.float32)})


def test_optional_has_and_get_element():
    nodes = [
        oh.make_node("Optional", ["x"], ["opt"]),
        oh.make_node("OptionalHasElement", ["opt"], ["has"]),
        oh.make_node("OptionalGetElement", ["opt"], ["y"]),
    ]
    outputs = [oh.make_tensor_value_info("has", onnx.TensorProto.BOOL, []), oh.make_tensor_value_info("y", F, [2])]
    model = _model(nodes, [oh.make_tensor_value_info("x", F, [2])], outputs, opset=18)
    _check(model, {"x": np.array([1.0, 2.0], np.float32)})


def test_empty_optional():
    tensor_type = oh.make_tensor_type_proto(F, [2])
    nodes = [oh.make_node("Optional", [], ["opt"], type=tensor_type), oh.make_node("OptionalHasElement", ["opt"], ["has"])]
    model = _model(nodes, [], [oh.make_tensor_value_info("has", onnx.TensorProto.BOOL, [])], opset=18)
    (has,) = translate(model)()
    assert np.asarray(has).dtype == np.bool_ and not bool(has)


def test_runtime_position_is_a_clear_error():
    """A position chosen at run time (an If's output) cannot pick a sequence element while tracing.

    A position fed as a graph input is fine: such inputs are compile-time constants.
    """
    nodes = [
        oh.make_node("SequenceConstruct", ["a"], ["s"]),
        opcheck.runtime_choice("i", "pick", "first", "second"),
        oh.make_node("SequenceAt", ["s", "i"], ["y"], name="at"),
    ]
    graph = oh.make_graph(
        nodes, "g",
        [oh.make_tensor_value_info("a", F, [2]), oh.make_tensor_value_info("pick", onnx.TensorProto.BOOL, [])],
        [oh.make_tensor_value_info("y", F, [2])],
        [onh.from_array(np.array(0, np.int64), "first"), onh.from_array(np.array(0, np.int64), "second")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    with pytest.raises(NodeError, match="'at'.*must be known while tracing"):
        translate(model)(np.zeros(2, np.float32), np.array(True))
    nodes = [nodes[0], nodes[2]]
    fed = _model(
        nodes, [oh.make_tensor_value_info("a", F, [2]), oh.make_tensor_value_info("i", I64, [])],
        [oh.make_tensor_value_info("y", F, [2])],
    )
    (y,) = translate(fed)(np.arange(2, dtype=np.float32), np.array(0, np.int64))
    np.testing.assert_array_equal(np.asarray(y), [0.0, 1.0])
