"""MatMul-like rule: M and N pass, K must match and all-reduces."""

from sharding.rules.matmul import parse_einsum


def test_column_parallel(g):
    r = g.one_node("MatMul", [("X", [2, 4, 8]), ("W", [8, 16])], {"W": "1:4 @ [0,1,2,3]"})
    assert g.out(r) == "2:4 @ [0,1,2,3]"
    assert r.diagnostics == ()


def test_row_parallel_all_reduces(g):
    r = g.one_node("MatMul", [("X", [2, 4, 8]), ("W", [8, 16])],
                   {"X": "2:4 @ [0,1,2,3]", "W": "0:4 @ [0,1,2,3]"})
    assert g.out(r) == "replicated @ [{0,1,2,3}]"
    assert g.codes(r) == ["collective"]


def test_k_mismatch_is_one_error_with_a_hint(g):
    r = g.one_node("MatMul", [("X", [4, 8]), ("W", [8, 16])],
                   {"X": "1:2 @ [0,1]", "W": "1:2 @ [0,1]"})
    [error] = r.errors()
    assert error.code == "k-sharding-mismatch"
    assert (error.tensor, error.axis) == ("W", 0)
    assert error.hint == "shard 'W' on axis 0 over the same devices as axis 1 of 'X'"


def test_k_sharded_differently_on_both_sides(g):
    r = g.one_node("MatMul", [("X", [4, 8]), ("W", [8, 16])],
                   {"X": "1:2 @ [0,1]", "W": "0:4 @ [0,1,2,3]"})
    assert g.codes(r, "error") == ["k-sharding-mismatch"]


def test_batched_matmul_with_broadcast_batch(g):
    r = g.one_node("MatMul", [("A", [2, 8, 4, 6]), ("B", [1, 8, 6, 5])],
                   {"A": "1:4 @ [0,1,2,3]", "B": "1:4 @ [0,1,2,3]"})
    assert g.out(r) == "1:4 @ [0,1,2,3]"
    r = g.one_node("MatMul", [("A", [2, 8, 4, 6]), ("B", [1, 8, 6, 5])], {"B": "0:2 @ [0,1]"})
    assert g.codes(r, "error") == ["broadcast-axis-sharded"]


def test_gemm_trans_b_and_bias(g):
    r = g.one_node("Gemm", [("A", [4, 8]), ("B", [16, 8]), ("C", [16])],
                   {"B": "0:2 @ [0,1]", "C": "0:2 @ [0,1]"}, transB=1)
    assert g.out(r) == "1:2 @ [0,1]"


def test_gemm_trans_a_k_mismatch(g):
    r = g.one_node("Gemm", [("A", [8, 4]), ("B", [8, 16])], {"A": "1:2 @ [0,1]", "B": "0:2 @ [0,1]"},
                   transA=1)
    assert g.codes(r, "error") == ["k-sharding-mismatch"]


def test_matmulinteger_and_qlinearmatmul(g):
    r = g.one_node("MatMulInteger", [("A", [4, 8]), ("B", [8, 16]), ("az", None)],
                   {"B": "1:2 @ [0,1]"}, inits=[g.const("az", __import__("numpy").uint8(0))])
    assert g.out(r) == "1:2 @ [0,1]"


def test_einsum_as_matmul(g):
    r = g.one_node("Einsum", [("A", [2, 4, 8]), ("B", [8, 6])], {"B": "1:2 @ [0,1]"},
                   equation="bik,kj->bij")
    assert g.out(r) == "2:2 @ [0,1]"
    r = g.one_node("Einsum", [("A", [2, 4, 8]), ("B", [8, 6])], {"A": "2:2 @ [0,1]", "B": "1:2 @ [0,1]"},
                   equation="bik,kj->bij")
    assert g.codes(r, "error") == ["empty-intersection"]


def test_einsum_parsing():
    assert parse_einsum("...ik,kj->...ij", [3, 2]) == (
        [[("e", 0), "i", "k"], ["k", "j"]], [("e", 0), "i", "j"])
    assert parse_einsum("ii->i", [2]) is None
    assert parse_einsum("ij,jk", [2, 2])[1] == ["i", "k"]


def test_qlinearmatmul_per_column_scale_follows_n(g):
    import numpy as np

    inits = [g.const(n, v) for n, v in [("as", np.float32(0.1)), ("az", np.uint8(0)),
                                         ("bs", np.full(16, 0.1, np.float32)), ("bz", np.zeros(16, np.uint8)),
                                         ("ys", np.float32(0.2)), ("yz", np.uint8(0))]]
    r = g.one_node("QLinearMatMul", [("A", [4, 8]), ("as", None), ("az", None), ("B", [8, 16]), ("bs", None),
                                     ("bz", None), ("ys", None), ("yz", None)],
                   {"B": "1:2 @ [0,1]", "bs": "0:2 @ [0,1]"}, inits=inits)
    assert g.out(r) == "1:2 @ [0,1]" and r.errors() == []
    r = g.one_node("QLinearMatMul", [("A", [4, 8]), ("as", None), ("az", None), ("B", [8, 16]), ("bs", None),
                                     ("bz", None), ("ys", None), ("yz", None)],
                   {"B": "1:2 @ [0,1]", "bs": "0:3 @ [0,1,2]"}, inits=inits)
    assert g.codes(r, "error") == ["sharding-mismatch"]


def test_gqa_key_heads_on_pairs_meet_query_heads(g):
    r = g.one_node("MatMul", [("Q", [2, 8, 5, 4]), ("K", [2, 8, 4, 5])],
                   {"Q": "1:8 @ [0,1,2,3,4,5,6,7]", "K": "1:4 @ [{0,1},{2,3},{4,5},{6,7}]"})
    assert r.errors() == [] and g.out(r) == "1:8 @ [0,1,2,3,4,5,6,7]"
