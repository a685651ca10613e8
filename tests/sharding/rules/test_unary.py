"""Unary rule: output = input spec, for 0007's list and the other elementwise ops."""

import pytest

from sharding.rules import RULES
from sharding.rules.unary import OPS

ZERO_SEVEN = ("Abs Acos Acosh Asin Asinh Atan Atanh Cast Ceil Cos Cosh Dropout Erf Exp Floor "
              "Identity IsInf IsNaN Log Neg Not Reciprocal Round Sigmoid Sign Sin Sinh Tan Tanh").split()


def test_0007_unary_list_and_common_activations_are_covered():
    for op in ZERO_SEVEN + ["Relu", "Gelu", "Softplus", "Clip", "LeakyRelu", "HardSwish", "Mish"]:
        assert op in OPS and RULES[op].ops == OPS


@pytest.mark.parametrize("op", ["Relu", "Gelu", "Softplus", "Tanh", "Erf"])
def test_output_keeps_input_spec(g, op):
    r = g.one_node(op, [("X", [4, 6])], {"X": "1:2 @ [{0,1},{2,3}]"})
    assert g.out(r) == "1:2 @ [{0,1},{2,3}]"
    assert r.diagnostics == ()


def test_clip_bounds_take_no_part(g):
    r = g.one_node("Clip", [("X", [4, 6]), ("lo", None), ("hi", None)], {"X": "0:4 @ [0,1,2,3]"},
                   inits=[g.const("lo", 0.0), g.const("hi", 6.0)])
    assert g.out(r) == "0:4 @ [0,1,2,3]"


def test_cast_and_dropout_mask(g):
    r = g.one_node("Cast", [("X", [4])], {"X": "0:2 @ [0,1]"}, to=7)
    assert g.out(r) == "0:2 @ [0,1]"
    r = g.one_node("Dropout", [("X", [4])], {"X": "0:2 @ [0,1]"}, outputs=("Y", "mask"))
    assert g.out(r, "mask") == "0:2 @ [0,1]"


def test_written_output_that_differs_is_a_reshard_note(g):
    r = g.one_node("Relu", [("X", [4, 6])], {"X": "1:2 @ [0,1]", "Y": "replicated @ [{0,1}]"})
    [note] = r.diagnostics
    assert (note.code, note.severity, note.tensor) == ("reshard", "note", "Y")
    assert "all-gather" in note.message
    assert g.out(r) == "replicated @ [{0,1}]"
