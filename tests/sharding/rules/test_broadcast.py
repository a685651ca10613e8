"""Broadcast n-ary rule: 0007's composition example, conflicts, constants."""

import pytest


def test_0007_broadcast_example_inferred_exactly(g):
    r = g.one_node("Add", [("A", [4, 1]), ("B", [1, 6])],
                   {"A": "0:2 @ [{0,1},{2,3}]", "B": "1:2 @ [{0,2},{1,3}]"})
    assert g.out(r) == "0:2,1:2 @ [0,1,2,3]"
    assert r.errors() == []


def test_0007_example_with_empty_intersection_is_rejected(g):
    r = g.one_node("Add", [("A", [4, 1]), ("B", [1, 6])],
                   {"A": "0:2 @ [{0,1},{2,3}]", "B": "1:2 @ [{0,1},{2,3}]"})
    [error] = r.errors()
    assert error.code == "empty-intersection"
    assert error.node == "n" and error.op_type == "Add"
    assert "output block [0, 1]" in error.message and "output block [1, 0]" in error.message
    assert g.out(r) is None


def test_non_broadcast_axes_must_match(g):
    r = g.one_node("Mul", [("A", [4, 6]), ("B", [4, 6])], {"A": "1:2 @ [0,1]", "B": "1:3 @ [0,1,2]"})
    [error] = r.errors()
    assert error.code == "sharding-mismatch"
    assert error.tensor == "B" and error.axis == 1
    assert error.given == "1:3 @ [0,1,2]" and "2 shards" in error.expected


def test_a_coarser_cut_on_groups_that_contain_the_finer_one_is_compatible(g):
    # DESIGN point 5: 4 blocks on pairs hold the 8 blocks of the other input.
    r = g.one_node("Add", [("A", [8, 2]), ("B", [8, 2])],
                   {"A": "0:8 @ [0,1,2,3,4,5,6,7]", "B": "0:4 @ [{0,1},{2,3},{4,5},{6,7}]"})
    assert r.errors() == [] and g.out(r) == "0:8 @ [0,1,2,3,4,5,6,7]"
    r = g.one_node("Add", [("A", [8, 2]), ("B", [8, 2])], {"A": "0:4 @ [0,1,2,3]", "B": "0:2 @ [0,1]"})
    assert g.codes(r, "error") == ["empty-intersection"]  # block 1 of 4 is on 1, its half on 0


def test_size_one_broadcast_axis_must_not_be_sharded(g):
    r = g.one_node("Add", [("A", [4, 1]), ("B", [4, 6])], {"A": "1:2 @ [0,1]"})
    [error] = r.errors()
    assert (error.code, error.tensor, error.axis) == ("broadcast-axis-sharded", "A", 1)


def test_sharded_plus_scalar_constant_infers_cleanly(g):
    r = g.one_node("Mul", [("X", [4, 6]), ("s", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("s", 0.5)])
    assert g.out(r) == "1:2 @ [0,1]"
    assert r.diagnostics == ()


def test_sharded_plus_replicated_bias_keeps_the_sharding(g):
    r = g.one_node("Add", [("X", [2, 4, 6]), ("b", None)], {"X": "2:2 @ [0,1]"},
                   inits=[g.const("b", [0.0] * 6)])
    assert g.out(r) == "2:2 @ [0,1]"


def test_same_axis_sharded_on_different_devices_has_no_common_device(g):
    r = g.one_node("Sub", [("A", [4]), ("B", [4])], {"A": "0:2 @ [0,1]", "B": "0:2 @ [2,3]"})
    assert g.codes(r, "error") == ["empty-intersection"]


def test_three_inputs_where(g):
    r = g.one_node("Where", [("c", [4, 1]), ("x", [4, 6]), ("y", [1, 6])],
                   {"x": "0:2 @ [0,1]"})
    assert g.out(r) == "0:2 @ [0,1]"


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean", "Pow", "Equal", "PRelu", "BitShift"])
def test_other_broadcast_ops(g, op):
    r = g.one_node(op, [("A", [4, 6]), ("B", [4, 6])], {"A": "0:2 @ [0,1]", "B": "0:2 @ [0,1]"})
    assert g.out(r) == "0:2 @ [0,1]"
