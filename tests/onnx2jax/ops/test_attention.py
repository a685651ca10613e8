"""Attention, RotaryEmbedding, LinearAttention, FlexAttention against onnxruntime or ONNX's reference."""

import functools

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from onnx.reference import ReferenceEvaluator

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


def _qkv(batch=2, heads_q=4, heads_kv=4, q_len=3, kv_len=5, head=8):
    return _f(batch, heads_q, q_len, head), _f(batch, heads_kv, kv_len, head), _f(batch, heads_kv, kv_len, head)


@pytest.mark.parametrize(
    "case", ["plain", "causal", "bool_mask", "float_mask", "gqa", "scale_softcap", "past", "past_causal"]
)
def test_attention_4d(case):
    q, k, v = _qkv(heads_kv=2 if case == "gqa" else 4)
    arrays, attrs, n_out = [q, k, v], {}, 1
    if case == "causal":
        attrs["is_causal"] = 1
    elif case == "bool_mask":
        arrays.append(RNG.random((3, 5)) > 0.3)
    elif case == "float_mask":
        arrays.append(_f(2, 1, 3, 5))
    elif case == "scale_softcap":
        attrs.update(scale=0.3, softcap=2.0)
    elif case.startswith("past"):
        arrays += [None, _f(2, 4, 4, 8), _f(2, 4, 4, 8)]
        n_out = 3
        if case == "past_causal":
            attrs["is_causal"] = 1
    check("Attention", 23, arrays, n_out=n_out, rtol=1e-4, atol=1e-5, **attrs)


def test_attention_3d_gqa():
    q, k, v = _f(2, 3, 4 * 6), _f(2, 5, 2 * 6), _f(2, 5, 2 * 6)
    check("Attention", 23, [q, k, v], q_num_heads=4, kv_num_heads=2, is_causal=1, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_attention_qk_output_modes(mode):
    q, k, v = _qkv()
    arrays = [q, k, v, _f(3, 5), None, None]
    # onnxruntime, not the reference: with a softcap, the reference's mode 0 output is softcapped too.
    check("Attention", 23, arrays, n_out=4, qk_matmul_output_mode=mode, softcap=3.0, rtol=1e-4, atol=1e-5)


def test_attention_fully_masked_rows_are_zero():
    q, k, v = _qkv()
    mask = np.ones((3, 5), bool)
    mask[1] = False
    check("Attention", 23, [q, k, v, mask], oracle="reference", rtol=1e-4, atol=1e-5)


def test_attention_24_nonpad_kv_seqlen():
    q, k, v = _qkv()
    arrays = [q, k, v, None, None, None, np.array([3, 5], np.int64)]
    check("Attention", 24, arrays, is_causal=1, oracle="reference", rtol=1e-4, atol=1e-5)


def test_attention_25_sliding_window():
    q, k, v = _qkv(q_len=5)
    check("Attention", 25, [q, k, v], is_causal=1, left_window_size=2, oracle="reference", rtol=1e-4, atol=1e-5)


def test_attention_float16():
    q, k, v = (a.astype(np.float16) for a in _qkv())
    check("Attention", 23, [q, k, v], is_causal=1, rtol=5e-3, atol=5e-3)


def test_attention_bfloat16_long_rows_sum_to_one():
    # Scores of 2,048 keys: a sum accumulated in bfloat16 (as ONNX's numpy reference does) stalls
    # once it nears 1 and the probabilities come out twice too large; onnx2jax sums in float32.
    import ml_dtypes

    q, k, v = (a.astype(ml_dtypes.bfloat16) for a in _qkv(batch=1, heads_q=2, heads_kv=2, q_len=2, kv_len=2048))
    node = oh.make_node("Attention", ["q", "k", "v"], ["y"])
    bf16 = onnx.TensorProto.BFLOAT16
    model = oh.make_model(
        oh.make_graph([node], "g", [oh.make_tensor_value_info(n, bf16, None) for n in "qkv"],
                      [oh.make_tensor_value_info("y", bf16, None)]),
        opset_imports=[oh.make_opsetid("", 23)],
    )
    (y,) = translate(model)(q, k, v)
    q64, k64, v64 = (a.astype(np.float64) for a in (q, k, v))
    scores = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(q.shape[-1])
    p = np.exp(scores - scores.max(-1, keepdims=True))
    expected = (p / p.sum(-1, keepdims=True)) @ v64
    np.testing.assert_allclose(np.asarray(y).astype(np.float64), expected, rtol=0, atol=2e-2)


def _caches(positions, half):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    angles = np.arange(positions)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("layout", ["4d", "3d", "partial"])
def test_rotary_embedding(interleaved, layout):
    batch, heads, seq, head = 2, 3, 5, 8
    dim = 4 if layout == "partial" else head
    cos, sin = _caches(16, dim // 2)
    positions = RNG.integers(0, 16, (batch, seq)).astype(np.int64)
    x = _f(batch, heads, seq, head) if layout != "3d" else _f(batch, seq, heads * head)
    attrs = dict(interleaved=interleaved)
    if layout == "3d":
        attrs["num_heads"] = heads
    if layout == "partial":
        attrs["rotary_embedding_dim"] = dim
    check("RotaryEmbedding", 23, [x, cos, sin, positions], **attrs)


def test_rotary_embedding_without_position_ids():
    cos, sin = _caches(5, 4)
    cos, sin = np.broadcast_to(cos, (2, 5, 4)).copy(), np.broadcast_to(sin, (2, 5, 4)).copy()
    check("RotaryEmbedding", 23, [_f(2, 3, 5, 8), cos, sin], oracle="reference")


@pytest.mark.parametrize("rule", ["linear", "gated_delta"])
def test_linear_attention(rule):
    b, t, hq, hkv, dk, dv = 2, 4, 4, 2, 3, 5
    arrays = [_f(b, t, hq * dk), _f(b, t, hkv * dk) * 0.3, _f(b, t, hkv * dv), _f(b, hkv, dk, dv)]
    arrays.append(-np.abs(_f(b, t, hkv)) if rule in ("gated", "gated_delta") else None)
    arrays.append(RNG.random((b, t, hkv)).astype(np.float32) if rule in ("delta", "gated_delta") else None)
    check(
        "LinearAttention", 27, arrays, n_out=2, update_rule=rule, q_num_heads=hq, kv_num_heads=hkv,
        oracle="reference", rtol=1e-4, atol=1e-5,
    )


def test_flex_attention_with_score_mod():
    score_mod = oh.make_graph(
        [oh.make_node("Tanh", ["s"], ["t"])],
        "score_mod",
        [oh.make_tensor_value_info("s", onnx.TensorProto.FLOAT, None)],
        [oh.make_tensor_value_info("t", onnx.TensorProto.FLOAT, None)],
    )
    q, k, v = _qkv(heads_kv=2)
    model, feeds = opcheck.single_node_model("FlexAttention", 1, [q, k, v], domain="ai.onnx.preview", score_mod=score_mod)
    expected = ReferenceEvaluator(model).run(None, feeds)[0]
    actual = np.asarray(translate(model)(*feeds.values())[0])
    assert actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
