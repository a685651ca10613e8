"""GroupQueryAttention and RotaryEmbedding (com.microsoft): sharded over batch and heads.

Expected specs derived by hand from DESIGN's semantics: query head j reads kv head j // (H / KV); a device
computing query block j must hold the kv block containing that head; heads are never reduced.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from sharding import infer

G8 = "[{0,1,2,3},{4,5,6,7}]"  # 2 kv heads, each on the 4 devices whose query heads read it
ALL8 = "[0,1,2,3,4,5,6,7]"


def _run(g, op, inputs, specs, outputs, inits=(), **attrs):
    """One com.microsoft node; ``inputs`` ``[(name, shape, dtype)]`` ("" = omitted; shape None = init)."""
    node = helper.make_node(op, [n for n, _, _ in inputs], list(outputs), name="n", domain="com.microsoft", **attrs)
    g.annotate(node, specs)
    typed = [g.value(n, s, t) for n, s, t in inputs if n and s is not None]
    model = g.model([node], typed, inits=inits)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return infer(model)


F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
OUTS = ("Y", "present_key", "present_value")


def _gqa(g, specs, *, heads=8, kv=2, d=16, b=1, s=3, p=6, packed=True):
    width = (heads + 2 * kv) * d if packed else heads * d
    inputs = [("q", [b, s, width], F)]
    inputs += [("", None, F), ("", None, F)] if packed else [("k", [b, s, kv * d], F), ("v", [b, s, kv * d], F)]
    inputs += [
        ("past_key", [b, kv, p, d], F), ("past_value", [b, kv, p, d], F), ("seqlens_k", [b], I32),
        ("total", [], I32), ("cos", [64, d // 2], F), ("sin", [64, d // 2], F),
    ]
    return _run(g, "GroupQueryAttention", inputs, specs, OUTS, num_heads=heads, kv_num_heads=kv, do_rotary=1)


def test_packed_query_whole_and_cache_in_kv_groups(g):
    """The builder's case on 8 devices (8 query heads, 2 kv heads): the packed q|k|v whole everywhere, the
    past split 2 ways in groups; each group computes the 4 query heads of its kv head."""
    r = _gqa(g, {"q": "replicated @ [{0,1,2,3,4,5,6,7}]", "past_key": f"1:2 @ {G8}", "past_value": f"1:2 @ {G8}"})
    assert g.out(r) == f"2:2 @ {G8}"
    assert g.out(r, "present_key") == f"1:2 @ {G8}"
    assert g.out(r, "present_value") == f"1:2 @ {G8}"
    assert g.codes(r, "error") == []


def test_separate_q_by_query_heads_kv_by_kv_heads(g):
    r = _gqa(g, {"q": f"2:8 @ {ALL8}", "k": f"2:2 @ {G8}", "v": f"2:2 @ {G8}", "past_key": f"1:2 @ {G8}",
                 "past_value": f"1:2 @ {G8}"}, packed=False)
    assert g.out(r) == f"2:8 @ {ALL8}"
    assert g.out(r, "present_key") == f"1:2 @ {G8}"
    assert g.codes(r, "error") == [] and "collective" not in g.codes(r)


def test_kv_whole_on_every_device_is_the_replicate_mode(g):
    r = _gqa(g, {"q": f"2:8 @ {ALL8}", "k": "replicated @ [{0,1,2,3,4,5,6,7}]",
                 "v": "replicated @ [{0,1,2,3,4,5,6,7}]"}, packed=False)
    assert g.out(r) == f"2:8 @ {ALL8}"
    assert g.out(r, "present_key") == "replicated @ [{0,1,2,3,4,5,6,7}]"


def test_kv_head_on_devices_whose_query_heads_do_not_read_it(g):
    """Query heads 0-3 (devices 0-3) read kv head 0, which this places on the even devices."""
    r = _gqa(g, {"q": f"2:8 @ {ALL8}", "k": "2:2 @ [{0,2,4,6},{1,3,5,7}]", "v": "2:2 @ [{0,2,4,6},{1,3,5,7}]"},
             packed=False)
    assert "empty-intersection" in g.codes(r, "error")


def test_packed_unequal_parts_cannot_be_split_on_hidden(g):
    r = _gqa(g, {"q": "2:2 @ [0,1]"})
    assert g.codes(r, "error") == ["attention-heads-split"]
    assert "product" in r.diagnostics[0].message


def test_packed_equal_parts_split_through_a_fused_axis(g):
    """H == KV: [{3, 1 shard}, {H*D, 2 shards}] gives each device its heads of q, k and v."""
    r = _gqa(g, {"q": "2:(3x1,64x2) @ [0,1]"}, heads=4, kv=4, d=16)
    assert g.out(r) == "2:2 @ [0,1]"
    assert g.out(r, "present_key") == "1:2 @ [0,1]"
    assert g.codes(r, "error") == []


def test_query_cut_inside_a_head(g):
    r = _gqa(g, {"q": f"2:8 @ {ALL8}", "k": "replicated @ [{0,1,2,3,4,5,6,7}]",
                 "v": "replicated @ [{0,1,2,3,4,5,6,7}]"}, heads=4, kv=2, packed=False)
    assert g.codes(r, "error") == ["attention-heads-split"]


def test_sequence_axis_of_the_cache_must_be_whole(g):
    r = _gqa(g, {"past_key": "2:2 @ [0,1]"})
    assert g.codes(r, "error") == ["attention-axis-sharded"]
    assert r.diagnostics[0].axis == 2


def test_rotary_cache_must_be_whole(g):
    r = _gqa(g, {"q": "replicated @ [{0,1}]", "cos": "0:2 @ [0,1]"})
    assert g.codes(r, "error") == ["attention-axis-sharded"]


def test_batch_passes_through(g):
    r = _gqa(g, {"q": "0:2 @ [0,1]", "past_key": "0:2 @ [0,1]", "past_value": "0:2 @ [0,1]",
                 "seqlens_k": "0:2 @ [0,1]"}, b=2)
    assert g.out(r) == "0:2 @ [0,1]"
    assert g.out(r, "present_key") == "0:2 @ [0,1]"


def _rotary(g, x_shape, specs, pos_shape=(2, 3), **attrs):
    inputs = [("x", list(x_shape), F), ("pos", list(pos_shape), I64), ("cos", [64, 8], F), ("sin", [64, 8], F)]
    return _run(g, "RotaryEmbedding", inputs, specs, ("Y",), **attrs)


def test_rotary_hidden_split_by_whole_heads(g):
    r = _rotary(g, (2, 3, 128), {"x": f"2:8 @ {ALL8}"}, num_heads=8)
    assert g.out(r) == f"2:8 @ {ALL8}"


def test_rotary_heads_from_the_cache_when_num_heads_is_not_given(g):
    """cos [64, 8]: rotary dim 16, so 128 features are 8 heads; 16 shards would cut them (8 devices: 4)."""
    r = _rotary(g, (2, 3, 128), {"x": "2:4 @ [0,1,2,3]"})
    assert g.out(r) == "2:4 @ [0,1,2,3]"


def test_rotary_bnsh_heads_pass_and_head_size_stays_whole(g):
    assert g.out(_rotary(g, (2, 4, 3, 16), {"x": "1:4 @ [0,1,2,3]"})) == "1:4 @ [0,1,2,3]"
    assert g.codes(_rotary(g, (2, 4, 3, 16), {"x": "3:2 @ [0,1]"}), "error") == ["attention-axis-sharded"]


def test_rotary_sequence_with_per_token_positions(g):
    r = _rotary(g, (2, 4, 128), {"x": "1:2 @ [0,1]", "pos": "1:2 @ [0,1]"}, pos_shape=(2, 4), num_heads=8)
    assert g.out(r) == "1:2 @ [0,1]"
    r = _rotary(g, (2, 4, 128), {"x": "1:2 @ [0,1]"}, pos_shape=(1,), num_heads=8)
    assert g.codes(r, "error") == ["attention-axis-sharded"]
