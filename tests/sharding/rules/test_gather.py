"""Gather, GatherElements, GatherND; value ops (Shape, Range...)."""


def test_vocab_parallel_embedding_all_reduces(g):
    r = g.one_node("Gather", [("E", [256, 64]), ("ids", [2, 16])], {"E": "0:8 @ [0,1,2,3,4,5,6,7]"})
    assert g.out(r) == "replicated @ [{0,1,2,3,4,5,6,7}]"
    assert g.codes(r) == ["collective"]


def test_gather_keeps_unsharded_axis_and_index_sharding(g):
    r = g.one_node("Gather", [("E", [256, 64]), ("ids", [2, 16])],
                   {"E": "1:2 @ [0,1]", "ids": "replicated @ [{0,1}]"})
    assert g.out(r) == "2:2 @ [0,1]"
    r = g.one_node("Gather", [("E", [256, 64]), ("ids", [2, 16])], {"ids": "0:2 @ [0,1]"})
    assert g.out(r) == "0:2 @ [0,1]"


def test_gather_elements_and_nd(g):
    r = g.one_node("GatherElements", [("D", [4, 8]), ("I", [4, 3])], {"D": "0:2 @ [0,1]"}, axis=1)
    assert g.out(r) == "0:2 @ [0,1]"
    r = g.one_node("GatherND", [("D", [4, 8, 6]), ("I", [4, 5, 1])], {"D": "0:2 @ [0,1]"},
                   batch_dims=1)
    assert g.out(r) == "0:2 @ [0,1]"


def test_shape_and_range_are_replicated(g):
    r = g.one_node("Shape", [("X", [4, 8])], {"X": "0:2 @ [0,1]"})
    assert g.out(r) == "replicated @ [{0,1}]"
