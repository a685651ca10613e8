"""Reduction rule: kept axes keep their sharding, reduced sharded axes all-reduce."""

import numpy as np
import pytest

from sharding.rules.reduction import ARG, REDUCE


def test_every_reduce_op_is_covered():
    assert REDUCE >= {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
                      "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
    assert ARG == {"ArgMax", "ArgMin"}


def test_reduce_over_unsharded_axis_keeps_sharding_keepdims(g):
    r = g.one_node("ReduceSum", [("X", [4, 6]), ("axes", None)], {"X": "0:2 @ [0,1]"},
                   inits=[g.const("axes", [1])])
    assert g.out(r) == "0:2 @ [0,1]"
    assert r.diagnostics == ()


def test_reduce_without_keepdims_renumbers_axes(g):
    r = g.one_node("ReduceMean", [("X", [4, 6, 8]), ("axes", None)], {"X": "2:2 @ [0,1]"},
                   inits=[g.const("axes", [0])], keepdims=0)
    assert g.out(r) == "1:2 @ [0,1]"


def test_axes_as_attribute_in_older_opsets(g):
    r = g.one_node("ReduceMax", [("X", [4, 6])], {"X": "1:2 @ [0,1]"}, opset=13, axes=[0], keepdims=0)
    assert g.out(r) == "0:2 @ [0,1]"


def test_reducing_a_sharded_axis_gives_replicated_output_and_an_all_reduce(g):
    r = g.one_node("ReduceSum", [("X", [4, 6]), ("axes", None)], {"X": "1:2 @ [{0,1},{2,3}]"},
                   inits=[g.const("axes", [1])])
    assert g.out(r) == "replicated @ [{0,1,2,3}]"
    [note] = r.diagnostics
    assert note.code == "collective" and note.expected == "all-reduce"


def test_default_axes_reduce_everything(g):
    r = g.one_node("ReduceL2", [("X", [4, 6])], {"X": "0:2 @ [0,1]"}, keepdims=0)
    assert g.out(r) == "replicated @ [{0,1}]"


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_one_axis(g, op):
    r = g.one_node(op, [("X", [4, 6])], {"X": "0:2 @ [0,1]"}, axis=1, keepdims=0)
    assert g.out(r) == "0:2 @ [0,1]"


def test_written_sharded_output_after_reduction_is_a_reduce_scatter(g):
    r = g.one_node("ReduceSum", [("X", [4, 6]), ("axes", None)],
                   {"X": "1:2 @ [0,1]", "Y": "0:2 @ [0,1]"}, inits=[g.const("axes", [1])])
    reshard = [d for d in r.diagnostics if d.code == "reshard"]
    assert "reduce-scatter" in reshard[0].message


def test_topk_keeps_other_axes_and_gathers_the_selected_one(g):
    inputs = [("X", [4, 8]), ("k", None)]
    r = g.one_node("TopK", inputs, {"X": "0:2 @ [0,1]"}, inits=[g.const("k", np.array([2]))],
                   outputs=("V", "I"))
    assert (g.out(r, "V"), g.out(r, "I")) == ("0:2 @ [0,1]", "0:2 @ [0,1]")
    r = g.one_node("TopK", inputs, {"X": "1:2 @ [0,1]"}, inits=[g.const("k", np.array([2]))],
                   outputs=("V", "I"))
    assert g.out(r, "V") == "replicated @ [{0,1}]"
    assert "collective" in g.codes(r)
