"""MatMulNBits: column by N (B, scales, zero points, bias alike), row by whole K blocks (an all-reduce).

K = 64, N = 32, block 16, 4 bits: B uint8 [32, 4, 8], scales [32, 4] (or flat [128]), zero points uint8
[32, 2] (two 4-bit blocks a byte).
"""

from __future__ import annotations

from onnx import TensorProto, helper

from sharding import infer

F, U8 = TensorProto.FLOAT, TensorProto.UINT8


def _mm(g, specs, *, scales=(32, 4), zero_points=False, bias=False, m=(3,)):
    inputs = [("A", [*m, 64], F), ("B", [32, 4, 8], U8), ("scales", list(scales), F)]
    if zero_points or bias:
        inputs.append(("zp", [32, 2], U8) if zero_points else ("", None, None))
    if bias:
        inputs += [("", None, None), ("bias", [32], F)]
    node = helper.make_node("MatMulNBits", [n for n, _, _ in inputs], ["Y"], name="n", domain="com.microsoft",
                            K=64, N=32, bits=4, block_size=16)
    g.annotate(node, specs)
    model = g.model([node], [g.value(n, s, t) for n, s, t in inputs if n])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return infer(model)


def test_column_by_n(g):
    r = _mm(g, {"A": "replicated @ [{0,1}]", "B": "0:2 @ [0,1]", "scales": "0:2 @ [0,1]", "zp": "0:2 @ [0,1]",
                "bias": "0:2 @ [0,1]"}, zero_points=True, bias=True, m=(2, 3))
    assert g.out(r) == "2:2 @ [0,1]"
    assert g.codes(r) == []


def test_row_by_k_blocks_is_an_all_reduce(g):
    r = _mm(g, {"A": "1:2 @ [0,1]", "B": "1:2 @ [0,1]", "scales": "1:2 @ [0,1]", "zp": "1:2 @ [0,1]"},
            zero_points=True)
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.codes(r) == ["collective"]
    assert r.diagnostics[0].expected == "all-reduce"


def test_flat_scales_by_n_and_by_k_blocks(g):
    """Flat [N * 4] scales are N-major: a plain cut is by N, [{32, 1}, {4, 2}] by K blocks."""
    r = _mm(g, {"A": "replicated @ [{0,1}]", "B": "0:2 @ [0,1]", "scales": "0:2 @ [0,1]"}, scales=(128,))
    assert g.out(r) == "1:2 @ [0,1]"
    r = _mm(g, {"A": "1:2 @ [0,1]", "B": "1:2 @ [0,1]", "scales": "0:(32x1,4x2) @ [0,1]"}, scales=(128,))
    assert g.out(r) == "replicated @ [{0,1}]"
    assert g.codes(r, "error") == []


def test_k_cut_inside_a_block(g):
    """4 blocks along K cannot be cut 8 ways."""
    r = _mm(g, {"A": "1:8 @ [0,1,2,3,4,5,6,7]", "B": "1:8 @ [0,1,2,3,4,5,6,7]"})
    assert "quantized-block-split" in g.codes(r, "error")


def test_blob_axis_stays_whole(g):
    r = _mm(g, {"B": "2:2 @ [0,1]"})
    assert g.codes(r, "error") == ["quantized-block-split"]


def test_k_blocks_on_other_devices_than_a(g):
    r = _mm(g, {"A": "1:2 @ [0,1]", "B": "1:2 @ [1,0]", "scales": "1:2 @ [1,0]"})
    assert g.codes(r, "error")
    assert g.out(r) is None


def test_scales_cut_unlike_the_weight(g):
    r = _mm(g, {"A": "replicated @ [{0,1}]", "B": "0:2 @ [0,1]", "scales": "1:2 @ [0,1]"})
    assert g.codes(r, "error")
