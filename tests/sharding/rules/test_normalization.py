"""Softmax, LayerNorm, RMSNorm, CumSum: reductions over their axes that keep the shape."""


def test_softmax_over_unsharded_axis_keeps_sharding(g):
    r = g.one_node("Softmax", [("X", [2, 8, 16, 16])], {"X": "1:4 @ [0,1,2,3]"}, axis=-1)
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    assert r.diagnostics == ()


def test_softmax_over_sharded_axis_comes_out_whole(g):
    r = g.one_node("LogSoftmax", [("X", [4, 8])], {"X": "1:2 @ [0,1]"}, axis=1)
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.codes(r) == ["collective"]


def test_softmax_opset_11_normalises_trailing_axes(g):
    r = g.one_node("Softmax", [("X", [2, 4, 8])], {"X": "1:2 @ [0,1]"}, axis=1, opset=11)
    assert g.out(r) == "replicated @ [{0,1}]"


def test_layernorm_keeps_batch_sharding_and_never_shards_hidden(g):
    r = g.one_node("LayerNormalization", [("X", [4, 6, 8]), ("s", None), ("b", None)],
                   {"X": "0:2 @ [0,1]"}, inits=[g.const("s", [1.0] * 8), g.const("b", [0.0] * 8)])
    assert g.out(r) == "0:2 @ [0,1]"


def test_layernorm_over_sharded_hidden_axis(g):
    r = g.one_node("LayerNormalization", [("X", [4, 8]), ("s", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("s", [1.0] * 8)], outputs=("Y", "mean", "inv"))
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.out(r, "mean") == "replicated @ [{0,1}]"


def test_rmsnormalization(g):
    r = g.one_node("RMSNormalization", [("X", [4, 8]), ("s", None)], {"X": "0:2 @ [0,1]"},
                   inits=[g.const("s", [1.0] * 8)], opset=23)
    assert g.out(r) == "0:2 @ [0,1]"


def test_cumsum_axis_from_constant(g):
    r = g.one_node("CumSum", [("X", [4, 8]), ("axis", None)], {"X": "0:2 @ [0,1]"},
                   inits=[g.const("axis", 1)])
    assert g.out(r) == "0:2 @ [0,1]"
