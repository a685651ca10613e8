"""Shape ops: Reshape (split/fuse), Transpose, Squeeze/Unsqueeze, Flatten, Concat, Split, Slice, Expand, Tile."""

from sharding.rules.regroup import reshape_groups


def test_reshape_groups():
    assert reshape_groups(("b", "s", 8, 8), ("b*s", 64)) == [([0, 1], [0]), ([2, 3], [1])]
    assert reshape_groups(("b", "s", 64), ("b", "s", 8, 8)) == [([0], [0]), ([1], [1]), ([2], [2, 3])]
    assert reshape_groups((2, 3), (3, 2)) == [([0, 1], [0, 1])]


def test_reshape_splitting_a_sharded_axis_moves_it_to_the_heads(g):
    r = g.one_node("Reshape", [("X", [2, 4, 64]), ("s", None)], {"X": "2:8 @ [0,1,2,3,4,5,6,7]"},
                   inits=[g.const("s", [2, 4, 8, 8])])
    assert g.out(r) == "2:8 @ [0,1,2,3,4,5,6,7]"


def test_reshape_splitting_into_fused_axis(g):
    # 64 in 8 shards viewed as [4, 16]: outer axis in 4, inner in 2.
    r = g.one_node("Reshape", [("X", [64]), ("s", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   inits=[g.const("s", [4, 16])])
    assert g.out(r) == "0:4,1:2 @ [0,1,2,3,4,5,6,7]"


def test_reshape_fusing_heads_back(g):
    r = g.one_node("Reshape", [("X", [2, 4, 8, 8]), ("s", None)], {"X": "2:4 @ [0,1,2,3]"},
                   inits=[g.const("s", [2, 4, 64])])
    assert g.out(r) == "2:4 @ [0,1,2,3]"


def test_reshape_fusing_unsharded_outer_gives_fused_spec(g):
    r = g.one_node("Reshape", [("X", [2, 64]), ("s", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("s", [128])])
    assert g.out(r) == "0:(2x1,64x2) @ [0,1]"


def test_reshape_with_dims_listed_out_of_order_permutes_devices(g):
    r = g.one_node("Reshape", [("X", [2, 4]), ("s", None)], {"X": "1:2,0:2 @ [0,1,2,3]"},
                   inits=[g.const("s", [8])])
    # Shard (row block i, col block j) was device 2*j + i; the fused axis numbers it 2*i + j.
    assert g.out(r) == "0:(2x2,4x2) @ [0,2,1,3]"


def test_reshape_straddling_shards_gathers_with_a_warning(g):
    r = g.one_node("Reshape", [("X", [6]), ("s", None)], {"X": "0:2 @ [0,1]"},
                   inits=[g.const("s", [2, 3])])
    assert g.out(r) == "0:2 @ [0,1]"  # blocks of 3 are whole rows
    r = g.one_node("Reshape", [("X", [6]), ("s", None)], {"X": "0:3 @ [0,1,2]"},
                   inits=[g.const("s", [2, 3])])
    assert g.out(r) == "replicated @ [{0,1,2}]"
    assert g.codes(r, "warning") == ["reshape-unsupported"]


def test_transpose(g):
    r = g.one_node("Transpose", [("X", [2, 4, 8, 16])], {"X": "2:4 @ [0,1,2,3]"}, perm=[0, 2, 1, 3])
    assert g.out(r) == "1:4 @ [0,1,2,3]"


def test_unsqueeze_and_squeeze(g):
    r = g.one_node("Unsqueeze", [("X", [4, 8]), ("a", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("a", [0, 2])])
    assert g.out(r) == "3:2 @ [0,1]"
    r = g.one_node("Squeeze", [("X", [1, 8, 1]), ("a", None)], {"X": "1:2 @ [0,1]"},
                   inits=[g.const("a", [0])])
    assert g.out(r) == "0:2 @ [0,1]"
    r = g.one_node("Squeeze", [("X", [1, 8, 1])], {"X": "1:2 @ [0,1]"}, opset=11, axes=[0, 2])
    assert g.out(r) == "0:2 @ [0,1]"


def test_flatten(g):
    r = g.one_node("Flatten", [("X", [4, 2, 3])], {"X": "0:2 @ [0,1]"}, axis=1)
    assert g.out(r) == "0:2 @ [0,1]"


def test_concat_on_other_axis_keeps_sharding(g):
    r = g.one_node("Concat", [("A", [4, 8]), ("B", [4, 8])], {"A": "0:2 @ [0,1]", "B": "0:2 @ [0,1]"},
                   axis=1)
    assert g.out(r) == "0:2 @ [0,1]"


def test_concat_on_sharded_axis_gathers(g):
    r = g.one_node("Concat", [("A", [4, 8]), ("B", [4, 8])], {"A": "1:2 @ [0,1]"}, axis=1)
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.codes(r) == ["collective"]


def test_split_of_fused_qkv_gives_each_output_the_inner_split(g):
    r = g.one_node("Split", [("X", [2, 192])], {"X": "1:(3x1,64x8) @ [0,1,2,3,4,5,6,7]"},
                   outputs=("q", "k", "v"), axis=1, num_outputs=3)
    assert [g.out(r, n) for n in "qkv"] == ["1:8 @ [0,1,2,3,4,5,6,7]"] * 3


def test_split_aligned_with_shards(g):
    r = g.one_node("Split", [("X", [8]), ("sp", None)], {"X": "0:4 @ [0,1,2,3]"},
                   outputs=("a", "b"), inits=[g.const("sp", [4, 4])])
    assert (g.out(r, "a"), g.out(r, "b")) == ("0:2 @ [0,1]", "0:2 @ [2,3]")


def test_split_on_unsharded_axis(g):
    r = g.one_node("Split", [("X", [4, 6])], {"X": "0:2 @ [0,1]"}, outputs=("a", "b"), axis=1,
                   num_outputs=2)
    assert g.out(r, "b") == "0:2 @ [0,1]"


def test_split_straddling_shards_gathers(g):
    r = g.one_node("Split", [("X", [192])], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"}, outputs=("a", "b", "c"),
                   num_outputs=3)
    assert g.out(r, "a") == "replicated @ [{0,1,2,3,4,5,6,7}]"
    assert "collective" in g.codes(r)


def test_slice_whole_axis_keeps_and_partial_gathers(g):
    inits = [g.const("st", [0]), g.const("en", [2]), g.const("ax", [1])]
    r = g.one_node("Slice", [("X", [4, 8]), ("st", None), ("en", None), ("ax", None)],
                   {"X": "0:2 @ [0,1]"}, inits=inits)
    assert g.out(r) == "0:2 @ [0,1]"
    r = g.one_node("Slice", [("X", [4, 8]), ("st", None), ("en", None), ("ax", None)],
                   {"X": "1:2 @ [0,1]"}, inits=inits)
    assert g.out(r) == "replicated @ [{0,1}]"


def test_expand_broadcasts_size_one_axes(g):
    r = g.one_node("Expand", [("X", [4, 1, 8]), ("s", None)], {"X": "0:4 @ [0,1,2,3]"},
                   inits=[g.const("s", [4, 2, 8])])
    assert g.out(r) == "0:4 @ [0,1,2,3]"


def test_gqa_expand_then_reshape_meets_query_heads(g):
    # k heads [b, 4, 1, s, d] in 4 -> expand x2 -> [b, 8, s, d]: a plain 4-way split of 8 heads.
    from onnx import helper

    nodes = [
        helper.make_node("Expand", ["K", "s1"], ["E"], name="expand"),
        helper.make_node("Reshape", ["E", "s2"], ["R"], name="reshape"),
    ]
    g.annotate(nodes[0], {"K": "1:4 @ [0,1,2,3]"})
    m = g.model(nodes, [g.value("K", [2, 4, 1, 5, 8])],
                inits=[g.const("s1", [2, 4, 2, 5, 8]), g.const("s2", [2, 8, 5, 8])])
    r = g.infer(m)
    assert g.out(r, "R") == "1:4 @ [0,1,2,3]"


def test_tile_repeated_axis_comes_out_whole(g):
    r = g.one_node("Tile", [("X", [4, 8]), ("rep", None)], {"X": "0:2,1:2 @ [0,1,2,3]"},
                   inits=[g.const("rep", [1, 2])])
    assert g.out(r) == "0:2 @ [{0,1},{2,3}]"


def test_concat_of_inputs_sharded_on_the_concat_axis_gathers_without_error(g):
    r = g.one_node("Concat", [("A", [4, 8]), ("B", [4, 8])], {"A": "1:2 @ [0,1]", "B": "1:2 @ [0,1]"},
                   axis=1)
    assert r.errors() == [] and g.out(r) == "replicated @ [{0,1}]"
    r = g.one_node("Concat", [("A", [4, 8]), ("B", [4, 8])], {"A": "1:2 @ [0,1]", "B": "1:2 @ [2,3]"},
                   axis=1)
    assert g.codes(r, "error") == ["empty-intersection"]  # the two inputs live on disjoint devices


def test_split_pieces_no_mesh_can_hold_come_out_whole(g):
    # 8 shards cut [3, 5]: 3 and 5 of 8 shards are no sub-mesh of 8 devices (was a MeshMappingError at compile)
    r = g.one_node("Split", [("X", [8]), ("sp", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   outputs=("a", "b"), inits=[g.const("sp", [3, 5])])
    assert (g.out(r, "a"), g.out(r, "b")) == ("replicated @ [{0,1,2,3,4,5,6,7}]",) * 2
    assert "collective" in g.codes(r)


def test_split_keeps_the_expressible_piece_and_gathers_the_other(g):
    # [2, 6] of 8 shards: shards 0-1 are a sub-mesh, 6 of 8 is not
    r = g.one_node("Split", [("X", [8]), ("sp", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   outputs=("a", "b"), inits=[g.const("sp", [2, 6])])
    assert (g.out(r, "a"), g.out(r, "b")) == ("0:2 @ [0,1]", "replicated @ [{0,1,2,3,4,5,6,7}]")
    assert [d.tensor for d in r.diagnostics if d.code == "collective"] == ["b"]


def test_split_piece_off_its_alignment_comes_out_whole(g):
    # [2, 4, 2] of 8 shards: the 4 shards 2-5 start at no multiple of 4 (no sub-mesh); the others keep theirs
    r = g.one_node("Split", [("X", [8]), ("sp", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   outputs=("a", "b", "c"), inits=[g.const("sp", [2, 4, 2])])
    assert [g.out(r, n) for n in "abc"] == ["0:2 @ [0,1]", "replicated @ [{0,1,2,3,4,5,6,7}]", "0:2 @ [6,7]"]


def test_split_notes_say_why_a_piece_comes_out_whole(g):
    r = g.one_node("Split", [("X", [16]), ("sp", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   outputs=("a", "b", "c"), inits=[g.const("sp", [4, 3, 9])])
    assert g.out(r, "a") == "0:2 @ [0,1]"
    notes = {d.tensor: d.message for d in r.diagnostics if d.code == "collective"}
    assert "'b' does not begin and end on shard boundaries (every 2 of axis 0)" in notes["b"]
    assert "'c' does not begin and end" in notes["c"]
    r = g.one_node("Split", [("X", [8]), ("sp", None)], {"X": "0:8 @ [0,1,2,3,4,5,6,7]"},
                   outputs=("a", "b"), inits=[g.const("sp", [2, 6])])
    [note] = [d.message for d in r.diagnostics if d.code == "collective"]
    assert "'b' would hold 6 of the 8 shards of axis 0, a block no mesh of the devices can hold" in note
