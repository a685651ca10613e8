"""com.microsoft RotaryEmbedding and GroupQueryAttention against onnxruntime's CPU kernels.

GroupQueryAttention's outputs are compared where onnxruntime defines them: the output rows of real tokens
(a right-padded prompt's padding rows are unspecified) and the present cache's rows below each batch row's
length ``seqlens_k + 1`` (the rest is unspecified, or the shared buffer's old contents).
"""

import functools

import numpy as np
import onnxruntime as ort
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
MS = dict(domain="com.microsoft")
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, **MS)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("case", ["3d", "3d_offset", "4d", "partial", "num_heads", "scale"])
def test_rotary_embedding(interleaved, case):
    b, s, n, h = 2, 5, 3, 16
    cos, sin = _f(32, h // 2), _f(32, h // 2)
    x = _f(b, n, s, h) if case == "4d" else _f(b, s, n * h)
    positions = np.array([7], np.int64) if case == "3d_offset" else RNG.integers(0, 32, (b, s)).astype(np.int64)
    attrs = {"interleaved": interleaved}
    if case == "partial":
        cos, sin = cos[:, :4], sin[:, :4]
        attrs.update(num_heads=n, rotary_embedding_dim=8)
    elif case == "num_heads":
        attrs["num_heads"] = n
    elif case == "scale":  # onnxruntime's kernel does not use it
        attrs["scale"] = 2.0
    check("RotaryEmbedding", 1, [x, positions, cos, sin], **attrs)


def _gqa_inputs(
    b, s, heads, kv_heads, head, past, seqlens, total, *, packed, rotary, position_ids, bias, sink, dtype, rotary_dim
):
    f = functools.partial(_f, dtype=dtype)
    q, k, v = f(b, s, heads * head), f(b, s, kv_heads * head), f(b, s, kv_heads * head)
    arrays = [np.concatenate([q, k, v], axis=-1), None, None] if packed else [q, k, v]
    arrays += [f(b, kv_heads, past, head), f(b, kv_heads, past, head)] if past is not None else [None, None]
    arrays += [np.asarray(seqlens, np.int32), np.asarray(total, np.int32)]
    half = (rotary_dim or head) // 2
    arrays += [f(64, half), f(64, half)] if rotary else [None, None]
    arrays += [position_ids, bias, sink]
    return arrays


def check_gqa(
    *, b=2, s=1, heads=4, kv_heads=2, head=16, past=None, seqlens, total, packed=True, rotary=False,
    interleaved=0, position_ids=None, bias=None, sink=None, static_total=True, dtype=np.float32, tol=1e-5,
    rotary_dim=None, **attrs
):
    """One GroupQueryAttention node through onnxruntime and onnx2jax; compares the defined parts."""
    arrays = _gqa_inputs(
        b, s, heads, kv_heads, head, past, seqlens, total,
        packed=packed, rotary=rotary, position_ids=position_ids, bias=bias, sink=sink, dtype=dtype,
        rotary_dim=rotary_dim,
    )
    if rotary:
        attrs.update(do_rotary=1, rotary_interleaved=interleaved)
    model, feeds = opcheck.single_node_model(
        "GroupQueryAttention", 1, arrays, consts=(6,) if static_total else (), n_out=3, trim=True,
        num_heads=heads, kv_num_heads=kv_heads, **MS, **attrs,
    )
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)
    actual = [np.asarray(a) for a in translate(model)(*feeds.values())]
    for e, a in zip(expected, actual):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
    lengths = np.asarray(seqlens) + 1
    for row, length in enumerate(lengths):
        start = max(length - s, 0)
        real = slice(0, min(s, length - start))
        np.testing.assert_allclose(
            actual[0][row, real].astype(np.float32), expected[0][row, real].astype(np.float32), rtol=tol, atol=tol
        )
        for cache in (1, 2):
            np.testing.assert_allclose(
                actual[cache][row, :, :length].astype(np.float32),
                expected[cache][row, :, :length].astype(np.float32), rtol=tol, atol=tol,
            )
    return actual


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # group of 1, 2 and 4 query heads per key/value head (MQA)
def test_gqa_prompt(packed, kv_heads):
    check_gqa(s=5, kv_heads=kv_heads, seqlens=[4, 4], total=5, packed=packed)


@pytest.mark.parametrize("rotary", [False, True])
def test_gqa_right_padded_prompt(rotary):
    check_gqa(b=3, s=6, seqlens=[5, 2, 0], total=6, rotary=rotary)


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_gqa_decode_growing_cache(packed, kv_heads):
    """past of length total - 1, present one longer: the cache as a torch export grows it."""
    check_gqa(b=2, kv_heads=kv_heads, past=6, seqlens=[6, 6], total=7, packed=packed, rotary=True)


@pytest.mark.parametrize("static_total", [True, False])
def test_gqa_decode_shared_buffer(static_total):
    """past of the full capacity, rows of different lengths: present is the same capacity, updated in place."""
    present = check_gqa(b=3, past=12, seqlens=[6, 2, 9], total=10, rotary=True, static_total=static_total)
    assert present[1].shape == (3, 2, 12, 16)


def test_gqa_prompt_into_shared_buffer():
    check_gqa(b=2, s=5, past=12, seqlens=[4, 2], total=5, rotary=True)


def test_gqa_subsequent_prompt():
    """A chunk of 3 new tokens after 4 cached ones (chunked prefill)."""
    check_gqa(b=1, s=3, past=4, seqlens=[6], total=7, rotary=True, interleaved=1)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("packed", [True, False])
def test_gqa_rotary(interleaved, packed):
    check_gqa(s=4, seqlens=[3, 3], total=4, rotary=True, interleaved=interleaved, packed=packed)


@pytest.mark.parametrize("interleaved", [0, 1])
def test_gqa_partial_rotary(interleaved):
    """A cos/sin cache narrower than head / 2 rotates the first features only (phi-style partial rotary)."""
    check_gqa(s=4, head=32, seqlens=[3, 2], total=4, rotary=True, rotary_dim=16, interleaved=interleaved)
    check_gqa(head=32, past=8, seqlens=[5, 7], total=8, rotary=True, rotary_dim=16, interleaved=interleaved)


def test_gqa_rotary_position_ids():
    ids = np.array([[3], [5]], np.int64)
    check_gqa(past=6, seqlens=[6, 6], total=7, rotary=True, position_ids=ids)


@pytest.mark.parametrize("static_total", [True, False])
def test_gqa_rotary_position_ids_first_prompt(static_total):
    """In a first prompt onnxruntime reads position_ids' first element and counts on from it, for every row."""
    ids = np.array([[2, 3, 4, 5], [7, 1, 2, 3]], np.int64)
    check_gqa(s=4, seqlens=[3, 1], total=4, rotary=True, position_ids=ids, static_total=static_total)


@pytest.mark.parametrize("window", [1, 3, 8])
def test_gqa_local_window_prompt(window):
    check_gqa(b=1, s=9, seqlens=[8], total=9, local_window_size=window, rotary=True)


def test_gqa_local_window_decode():
    check_gqa(b=2, past=10, seqlens=[8, 5], total=9, local_window_size=3)


def test_gqa_local_window_prompt_into_shared_buffer():
    check_gqa(s=6, past=12, seqlens=[5, 3], total=6, local_window_size=2, softcap=1.0)


@pytest.mark.parametrize("past", [None, 12])
def test_gqa_attention_bias_over_total_length(past):
    """attention_bias has total_sequence_length columns, fewer than a shared buffer's capacity."""
    s, seqlens, total = (1, [6, 2], 7) if past else (4, [3, 3], 4)
    check_gqa(s=s, past=past, seqlens=seqlens, total=total, bias=_f(2, 1, s, total), rotary=True)


def test_gqa_not_causal():
    check_gqa(s=4, seqlens=[3, 1], total=4, causal=0)


@pytest.mark.parametrize("attrs", [{"softcap": 0.5}, {"scale": 0.7}, {"softcap": 2.0, "scale": 0.3}])
def test_gqa_scale_softcap(attrs):
    check_gqa(s=5, seqlens=[4, 3], total=5, **attrs)


def test_gqa_attention_bias_after_softcap():
    check_gqa(b=1, s=5, seqlens=[4], total=5, bias=_f(1, 4, 5, 5), softcap=0.5)


def test_gqa_smooth_softmax_and_head_sink():
    check_gqa(s=5, seqlens=[4, 4], total=5, smooth_softmax=1)
    check_gqa(s=5, seqlens=[4, 4], total=5, sink=_f(4))


@pytest.mark.parametrize("past", [None, 8])
def test_gqa_float16(past):
    s, seqlens, total = (5, [4, 2], 5) if past is None else (1, [6, 3], 7)
    check_gqa(s=s, past=past, seqlens=seqlens, total=total, rotary=True, dtype=np.float16, tol=4e-3)


def _ring_end(past, capacity, window):
    """onnxruntime's WindowedCacheEnd, written out independently for the test (gap = C - W + 1)."""
    gap = capacity - window + 1
    if past <= capacity:
        return past
    return past - gap * (-(-(past - capacity) // gap))


@pytest.mark.parametrize("capacity, window, steps", [
    (4, 4, [5, 1, 3]),  # no slack: compacts every step; a prefill longer than the ring
    (7, 4, [6, 3, 1, 1]),  # slack 3: a chunk that evicts rows its first query reads (onnxruntime's staging), then in place
])
def test_gqa_sliding_window_ring_cache(capacity, window, steps):
    """sliding_window_cache=1 (the builder's ring cache): a run of steps through onnxruntime, each step's past its
    own previous present; onnx2jax's step on the same past gives the same output and the same resident rows
    (the first ``end(total)`` rows; the rest onnxruntime leaves unspecified)."""
    b, heads, kv, head = 1, 4, 2, 16
    past = [np.zeros((b, kv, capacity, head), np.float32)] * 2
    total = 0
    for s in steps:
        total += s
        qkv = _f(b, s, (heads + 2 * kv) * head)
        arrays = [qkv, None, None, past[0], past[1], np.array([total - 1], np.int32), np.array(total, np.int32),
                  _f(64, head // 2), _f(64, head // 2)]
        model, feeds = opcheck.single_node_model(
            "GroupQueryAttention", 1, arrays, consts=(6, 7, 8), n_out=3, trim=True, num_heads=heads, kv_num_heads=kv,
            local_window_size=window, sliding_window_cache=1, do_rotary=1, **MS,
        )
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        actual = [np.asarray(a) for a in translate(model)(*feeds.values())]
        np.testing.assert_allclose(actual[0], expected[0], rtol=1e-5, atol=1e-5, err_msg=f"total {total}")
        resident = _ring_end(total, capacity, window)
        for a, e in zip(actual[1:], expected[1:]):
            assert a.shape == e.shape == (b, kv, capacity, head)
            np.testing.assert_allclose(a[:, :, :resident], e[:, :, :resident], rtol=1e-6, atol=1e-6)
        past = expected[1:]


def test_gqa_unread_cache_rows_do_not_leak():
    """Rows past a row's length are never read: NaN there (a gathered pad id outside the vocabulary, say)
    leaves the output as onnxruntime gives it."""
    b, s, heads, kv, head, cap = 1, 1, 4, 2, 16, 10
    past = [_f(b, kv, cap, head) for _ in range(2)]
    for p in past:
        p[:, :, 6:] = np.nan
    arrays = [_f(b, s, (heads + 2 * kv) * head), None, None, past[0], past[1], np.array([4], np.int32),
              np.array(5, np.int32)]
    model, feeds = opcheck.single_node_model(
        "GroupQueryAttention", 1, arrays, consts=(6,), n_out=3, trim=True, num_heads=heads, kv_num_heads=kv, **MS
    )
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    actual = np.asarray(translate(model)(*feeds.values())[0])
    assert np.isfinite(expected[0]).all()
    np.testing.assert_allclose(actual, expected[0], rtol=1e-5, atol=1e-5)
