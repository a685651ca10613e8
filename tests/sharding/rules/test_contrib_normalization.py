"""SimplifiedLayerNormalization, Skip(Simplified)LayerNormalization: reductions over the last axis.

As LayerNormalization: batch axes keep their sharding; a sharded normalised axis comes out whole (an
all-gather, reported as a ``collective`` note); the residual sum (output 3) is elementwise and keeps all.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from sharding import infer


def _run(g, op, inputs, specs, outputs, domain, inits=(), **attrs):
    node = helper.make_node(op, [n for n, _ in inputs], list(outputs), name="n", domain=domain, **attrs)
    g.annotate(node, specs)
    model = g.model([node], [g.value(n, s) for n, s in inputs if s is not None], inits=inits)
    if domain:
        model.opset_import.append(helper.make_opsetid(domain, 1))
    return infer(model)


def test_simplified_keeps_batch_sharding(g):
    r = _run(g, "SimplifiedLayerNormalization", [("X", [4, 6, 8]), ("s", None)], {"X": "0:2 @ [0,1]"},
             ("Y", "inv"), "", inits=[g.const("s", [1.0] * 8)])
    assert g.out(r) == "0:2 @ [0,1]"
    assert g.out(r, "inv") == "0:2 @ [0,1]"


def test_simplified_over_sharded_hidden_comes_out_whole(g):
    r = _run(g, "SimplifiedLayerNormalization", [("X", [4, 8]), ("s", None)], {"X": "1:2 @ [0,1]"},
             ("Y",), "", inits=[g.const("s", [1.0] * 8)])
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.codes(r) == ["collective"]


def test_simplified_axis_attribute(g):
    """axis=1 of [4, 6, 8] normalises axes 1 and 2: only axis 0's cut survives."""
    r = _run(g, "SimplifiedLayerNormalization", [("X", [4, 6, 8]), ("s", None)], {"X": "0:2,1:2 @ [0,1,2,3]"},
             ("Y",), "", inits=[g.const("s", [[1.0] * 8] * 6)], axis=1)
    assert g.out(r) == "0:2 @ [{0,1},{2,3}]"


def test_skip_simplified_batch_and_residual(g):
    r = _run(g, "SkipSimplifiedLayerNormalization", [("x", [2, 3, 8]), ("skip", [2, 3, 8]), ("gamma", None)],
             {"x": "0:2 @ [0,1]", "skip": "0:2 @ [0,1]"}, ("Y", "", "", "sum"), "com.microsoft",
             inits=[g.const("gamma", [1.0] * 8)])
    assert g.out(r) == "0:2 @ [0,1]"
    assert g.out(r, "sum") == "0:2 @ [0,1]"
    assert g.codes(r, "error") == []


def test_skip_over_sharded_hidden(g):
    """The norm gathers the hidden axis; the residual sum is elementwise and stays split."""
    r = _run(g, "SkipSimplifiedLayerNormalization", [("x", [2, 3, 8]), ("skip", [2, 3, 8]), ("gamma", None)],
             {"x": "2:2 @ [0,1]", "skip": "2:2 @ [0,1]"}, ("Y", "", "", "sum"), "com.microsoft",
             inits=[g.const("gamma", [1.0] * 8)])
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.out(r, "sum") == "2:2 @ [0,1]"
    assert "collective" in g.codes(r)


def test_skip_inputs_must_agree(g):
    r = _run(g, "SkipLayerNormalization", [("x", [2, 3, 8]), ("skip", [2, 3, 8]), ("gamma", None), ("beta", None)],
             {"x": "0:2 @ [0,1]", "skip": "1:3 @ [0,1,2]"}, ("Y", "mean", "inv", "sum"), "com.microsoft",
             inits=[g.const("gamma", [1.0] * 8), g.const("beta", [0.0] * 8)])
    assert "empty-intersection" in g.codes(r, "error") or "sharding-mismatch" in g.codes(r, "error")


def test_skip_layernorm_statistics_keep_batch(g):
    r = _run(g, "SkipLayerNormalization", [("x", [2, 3, 8]), ("skip", [2, 3, 8]), ("gamma", None), ("beta", None)],
             {"x": "1:3 @ [0,1,2]", "skip": "1:3 @ [0,1,2]"}, ("Y", "mean", "inv", "sum"), "com.microsoft",
             inits=[g.const("gamma", [1.0] * 8), g.const("beta", [0.0] * 8)])
    for name in ("Y", "mean", "inv", "sum"):
        assert g.out(r, name) == "1:3 @ [0,1,2]"
