"""The serving engine (issue 29): continuous batching over a paged KV cache gives each greedy request exactly
the tokens it gets alone (onnxruntime-genai's stored tokens, transformers' for the torch export, and
onnx2jax.generate), whatever joins or leaves around it; a full cache preempts and resumes without touching
another request's pages; programs compile once; sampling parameters are per-request data."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.errors import RequestError
from onnx2jax.serving import Engine, SamplingParams

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
FIXTURES = ["llama_gqa", "llama_mqa", "qwen2_window", "llama_gqa_int4", "llama_gqa_torch"]


def _expected(name):
    return json.loads((GENAI / name / "expected_tokens.json").read_text())


def _engine(name, **kwargs):
    kwargs.setdefault("context_length", 256)  # the torch export has no genai_config.json to say it
    return Engine(str(GENAI / name), **kwargs)


# 6 pages of 8 positions for 3 slots: three requests of 32 tokens (4 pages each) cannot all run at once.
SMALL_CACHE = {"max_batch": 3, "max_tokens_in_cache": 48, "page_size": 8, "prefill_chunk": 8}


@pytest.fixture(scope="module")
def gqa_engine():
    """One llama_gqa engine for the module (its programs compile once): a small cache that preempts."""
    return _engine("llama_gqa", **SMALL_CACHE)


def _run_checked(engine, arrivals, aborts=None, pages_checked=True):
    """Steps ``engine``; ``arrivals`` {step: [(key, prompt, params)]}, ``aborts`` {key: n}: abort once it has n
    tokens (0: at once); checks the page and slot invariants every step and (``pages_checked``) that every
    running request's written positions stay unchanged while it runs. Returns {key: request id}."""
    aborts = dict(aborts or {})
    ids, snapshots = {}, {}
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for key, prompt, params in arrivals.get(step, []):
            ids[key] = engine.add_request(prompt, params)
        for key, n in list(aborts.items()):
            if key in ids and len(engine.tokens(ids[key])) >= n:
                engine.abort(ids[key])
                del aborts[key]
        engine.step()
        engine.scheduler.check()
        if not pages_checked:
            step += 1
            continue
        pages = [np.asarray(p) for p in engine.runner.pages]
        for seq in engine.scheduler.running:
            written = _cached(engine, seq, pages)
            before = snapshots.get((seq.id, seq.preemptions))
            if before is not None:  # a running request's pages hold what it wrote, written by nobody else
                np.testing.assert_array_equal(written[:, :, : before.shape[2]], before)
            snapshots[(seq.id, seq.preemptions)] = written
        step += 1
    return ids


def _compiled_once_per_width(engine):
    """Each program was traced once per block-table width it ran at (whatever the requests and steps), and the
    widths are powers of two."""
    runner = engine.runner
    for kind in runner.traces:
        shapes = {(r, w) for k, r, w in runner.widths if k == kind}
        assert runner.traces[kind] == len(shapes) and all(w & (w - 1) == 0 for _, w in shapes), (kind, shapes)


def _cached(engine, seq, pages):
    """The positions ``seq`` has written, of every cache input: [inputs, kv_heads, positions, head]."""
    return np.stack([np.swapaxes(p[seq.block], 0, 1).reshape(p.shape[1], -1, p.shape[-1])[:, : seq.cached]
                     for p in pages])


@pytest.mark.parametrize("name", [
    "llama_gqa", *(pytest.param(n, marks=pytest.mark.slow) for n in FIXTURES if n != "llama_gqa")])
def test_greedy_requests_joining_and_leaving_equal_each_alone(name, request):
    expected = _expected(name)
    prompts, tokens = expected["prompts"], expected["tokens"]
    length = expected["max_length"]
    engine = request.getfixturevalue("gqa_engine") if name == "llama_gqa" else _engine(name, **SMALL_CACHE)
    full = [SamplingParams(max_tokens=length - len(p)) for p in prompts]
    arrivals = {
        0: [("a", prompts[1], full[1])],
        2: [("b", prompts[0], full[0]), ("short", prompts[2], SamplingParams(max_tokens=3))],
        3: [("c", prompts[2], full[2]), ("aborted", prompts[0], full[0]),  # these wait: three slots are held
            ("queued", prompts[1], full[1])],
        9: [("late", prompts[1], SamplingParams(max_tokens=6))],
    }
    ids = _run_checked(engine, arrivals, aborts={"aborted": 2, "queued": 0})
    got = {key: engine.tokens(rid) for key, rid in ids.items()}
    assert prompts[1] + got["a"] == tokens[1]
    assert prompts[0] + got["b"] == tokens[0]
    assert prompts[2] + got["c"] == tokens[2]
    assert got["short"] == tokens[2][len(prompts[2]):][:3] and engine.finish_reason(ids["short"]) == "length"
    assert got["late"] == tokens[1][len(prompts[1]):][:6]
    assert engine.finish_reason(ids["aborted"]) == "abort"
    assert 2 <= len(got["aborted"]) < full[0].max_tokens and got["queued"] == []
    assert got["aborted"] == tokens[0][len(prompts[0]):][: len(got["aborted"])]
    assert engine.counts["pages_used"] == 0 and engine.counts["slots_used"] == 0
    _compiled_once_per_width(engine)
    if "eos_override" in expected:  # stopping at an eos mid-run, the eos not returned (onnxruntime-genai's)
        stop = expected["eos_override"]
        rid = engine.add_request(prompts[0], SamplingParams(max_tokens=length, stop_token_ids=(stop["eos_token_id"],)))
        other = engine.add_request(prompts[1], full[1])
        engine.run_to_completion()
        assert prompts[0] + engine.tokens(rid) == stop["tokens"][0] and engine.finish_reason(rid) == "stop"
        assert prompts[1] + engine.tokens(other) == tokens[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_engine_equals_onnx2jax_generate_alone(name):
    expected = _expected(name)
    decoder = onnx2jax.load(str(GENAI / name))
    engine = Engine(decoder, max_batch=2, max_tokens_in_cache=256, page_size=16, prefill_chunk=16,
                    context_length=256)
    prompts = expected["prompts"] + [expected["tokens"][1] * 3]  # 96 tokens: a wider block table
    ids = [engine.add_request(p, SamplingParams(max_tokens=12)) for p in prompts]
    engine.run_to_completion()
    for rid, prompt in zip(ids, prompts):
        alone = onnx2jax.generate(decoder, prompt, max_new_tokens=12)[0].tolist()
        assert prompt + engine.tokens(rid) == alone
    assert len({w for k, _, w in engine.runner.widths if k == "decode"}) == 2
    _compiled_once_per_width(engine)


@pytest.mark.slow
def test_a_sliding_window_model_served_from_pages_equals_generate_alone_and_onnxruntime_genai():
    """gemma2's local layers attend over a window of 8 (where ``generate`` keeps them in a ring cache); the
    engine keeps every position in pages and masks the window. 40 new tokens pass the window many times."""
    expected = _expected("arch/gemma2_fp32")
    decoder = onnx2jax.load(str(GENAI / "arch" / "gemma2_fp32"))
    engine = Engine(decoder, max_batch=2, max_tokens_in_cache=512, page_size=8, prefill_chunk=8)
    ids = [engine.add_request(p, SamplingParams(max_tokens=40)) for p in expected["prompts"]]
    engine.run_to_completion()
    for rid, prompt, stored in zip(ids, expected["prompts"], expected["tokens"]):
        assert prompt + engine.tokens(rid) == onnx2jax.generate(decoder, prompt, max_new_tokens=40)[0].tolist()
        assert (prompt + engine.tokens(rid))[:len(stored)] == stored


def test_several_decode_steps_a_call_give_each_request_its_own_tokens():
    """decode_steps=3: where nobody waits to be admitted, three decode steps a call, each request stopping at its
    own max_tokens or eos inside a call; the tokens are still onnxruntime-genai's, and joins still happen."""
    expected = _expected("llama_gqa")
    prompts, tokens, stop = expected["prompts"], expected["tokens"], expected["eos_override"]
    engine = _engine("llama_gqa", decode_steps=3, max_batch=3, max_tokens_in_cache=96, page_size=8, prefill_chunk=8)
    full = [SamplingParams(max_tokens=32 - len(p)) for p in prompts]
    arrivals = {
        0: [("a", prompts[1], full[1]), ("eos", prompts[0], SamplingParams(max_tokens=32, stop_token_ids=(187,)))],
        4: [("b", prompts[0], full[0]), ("short", prompts[2], SamplingParams(max_tokens=5))],
        9: [("c", prompts[2], full[2])],
    }
    ids = _run_checked(engine, arrivals)
    got = {key: engine.tokens(rid) for key, rid in ids.items()}
    assert prompts[1] + got["a"] == tokens[1] and prompts[0] + got["b"] == tokens[0]
    assert prompts[2] + got["c"] == tokens[2] and got["short"] == tokens[2][len(prompts[2]):][:5]
    assert prompts[0] + got["eos"] == stop["tokens"][0] and engine.finish_reason(ids["eos"]) == "stop"
    assert engine.runner.traces["decode_many"] > 0
    assert engine.stats["steps"] < engine.stats["decode_tokens"]  # several tokens a call
    assert engine.counts["pages_used"] == 0
    _compiled_once_per_width(engine)


def test_full_cache_preempts_and_resumes_without_touching_other_pages(gqa_engine):
    expected = _expected("llama_gqa")
    prompts, tokens = expected["prompts"], expected["tokens"]
    engine = gqa_engine
    preemptions = engine.stats["preemptions"]
    arrivals = {i: [(i, p, SamplingParams(max_tokens=32 - len(p)))] for i, p in enumerate(prompts)}
    ids = _run_checked(engine, arrivals)
    assert engine.stats["preemptions"] > preemptions
    for i, prompt in enumerate(prompts):
        assert prompt + engine.tokens(ids[i]) == tokens[i]
    with pytest.raises(RequestError, match="the whole cache holds 48"):
        engine.add_request(prompts[0], SamplingParams(max_tokens=100))


def _penalized_greedy(prompt, steps, penalty):
    """Plain onnxruntime: greedy with transformers' repetition penalty, the whole sequence each call."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(GENAI / "llama_gqa_torch" / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    tokens = list(prompt)
    for _ in range(steps):
        feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, len(tokens)), np.int64),
                 "position_ids": np.arange(len(tokens), dtype=np.int64)[None]}
        for i in (0, 1):
            for part in ("key", "value"):
                feeds[f"past_key_values.{i}.{part}"] = np.zeros((1, 2, 0, 16), np.float32)
        logits = session.run(["logits"], feeds)[0][0, -1].astype(np.float32)
        seen = np.unique(tokens)
        logits[seen] = np.where(logits[seen] < 0, logits[seen] * penalty, logits[seen] / penalty)
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt):]


def test_sampling_parameters_are_per_request_data():
    prompts = _expected("llama_gqa_torch")["prompts"]
    engine = _engine("llama_gqa_torch", max_batch=4, max_tokens_in_cache=512, page_size=16, prefill_chunk=16)
    sampled = SamplingParams(max_tokens=10, temperature=0.9, top_k=40, top_p=0.9, seed=7)
    alone = engine.add_request(prompts[1], sampled)
    engine.run_to_completion()
    penalized = SamplingParams(max_tokens=10, repetition_penalty=5.0)
    ids = [engine.add_request(prompts[0], penalized), engine.add_request(prompts[1], sampled),
           engine.add_request(prompts[2], SamplingParams(max_tokens=10, temperature=2.0, seed=1))]
    engine.run_to_completion()
    assert engine.tokens(ids[1]) == engine.tokens(alone)  # the same seed, whatever runs beside it
    assert engine.tokens(ids[0]) == _penalized_greedy(prompts[0], 10, 5.0)
    _compiled_once_per_width(engine)


@pytest.mark.parametrize("prompt, params, field", [
    ([1, 512], SamplingParams(), "prompt"),
    ([1, -1], SamplingParams(), "prompt"),
    ([], SamplingParams(), "prompt"),
    ([1] * 256, SamplingParams(), "prompt"),
])
def test_bad_requests_are_refused_by_name(gqa_engine, prompt, params, field):
    with pytest.raises(RequestError) as info:
        gqa_engine.add_request(prompt, params)
    assert info.value.field == field


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.5}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -1}, "top_k"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
])
def test_bad_parameters_are_refused_by_name(kwargs, field):
    with pytest.raises(RequestError) as info:
        SamplingParams(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("name, devices, ways", [
    pytest.param("llama_gqa", 2, 2, marks=pytest.mark.slow),  # 2 KV heads: one per device
    pytest.param("llama_gqa_torch", 2, 2, marks=pytest.mark.slow),
    pytest.param("llama_mqa", 2, 1, marks=pytest.mark.slow),  # 1 KV head: whole on each device
])
def test_tensor_parallel_pages_split_by_kv_heads_tokens_equal(name, devices, ways):
    expected = _expected(name)
    engine = _engine(name, devices=devices, **SMALL_CACHE)
    pages = engine.runner.pages[0]
    assert len(pages.sharding.device_set) == devices
    assert pages.sharding.shard_shape(pages.shape)[1] == pages.shape[1] // ways  # [pages, kv_heads, ...]
    ids = [engine.add_request(p, SamplingParams(max_tokens=32 - len(p))) for p in expected["prompts"]]
    engine.run_to_completion()
    for rid, prompt, tokens in zip(ids, expected["prompts"], expected["tokens"]):
        assert prompt + engine.tokens(rid) == tokens
    assert engine.stats["preemptions"] > 0
    _compiled_once_per_width(engine)


def test_warmup_compiles_every_shape_then_serving_compiles_nothing():
    expected = _expected("llama_gqa")
    engine = _engine("llama_gqa", max_batch=2, max_tokens_in_cache=256, page_size=16, prefill_chunk=16,
                     context_length=128)
    engine.warmup()
    runner = engine.runner
    assert runner.row_counts == [1, 2] and runner.block_widths == [4, 8]  # 64 and 128 positions
    assert runner.prefill_row_counts == [1, 2]
    assert runner.traces == {"prefill": 4, "decode": 4}
    ids = [engine.add_request(p, SamplingParams(max_tokens=32 - len(p))) for p in expected["prompts"]]
    ids.append(engine.add_request(expected["tokens"][1] * 2, SamplingParams(max_tokens=4)))  # 64 + 4: wider
    engine.run_to_completion()
    for rid, prompt, tokens in zip(ids, expected["prompts"], expected["tokens"]):
        assert prompt + engine.tokens(rid) == tokens
    assert runner.traces == {"prefill": 4, "decode": 4}
    assert {w for _, _, w in runner.widths} == {4, 8}


def test_greedy_choice_is_numpys_argmax_on_ties_nans_and_infinities():
    """The greedy pick of generation and serving (a max, then the lowest position holding it) is numpy's argmax: the lowest id
    among equal maxima, the first NaN where there is one, 0 on a row of -inf."""
    from onnx2jax.runtime.sampling import first_max

    rng = np.random.RandomState(0)
    rows = rng.randint(-3, 4, size=(64, 37)).astype(np.float32)  # small integers: many ties
    rows[5, [3, 30]] = np.nan
    rows[9] = -np.inf
    rows[11, 0] = np.inf
    assert np.asarray(jax.jit(first_max)(rows)).tolist() == np.argmax(rows, axis=-1).tolist()


def test_several_steps_a_call_update_the_pages_in_place():
    """A torch export concatenates past and new keys, so a decode call of several steps reads each page array and
    writes into it in the same loop: XLA CPU's default copy insertion copied every page array (the whole pool)
    twice a step there (8 copies of f32[9, 2, 8, 16] here); with region analysis
    (``xla_options.IN_PLACE_LOOP_FLAG``, as the Generator's decode loop) none, counted in the compiled HLO; the
    tokens are still transformers' (the stored ones)."""
    from onnx2jax.serving.sampler import SAMPLING_FIELDS

    engine = _engine("llama_gqa_torch", decode_steps=4, max_batch=2, max_tokens_in_cache=64, page_size=8,
                     prefill_chunk=8)
    runner = engine.runner
    width = runner.block_widths[0]
    idle = np.zeros((1, width + 3 + SAMPLING_FIELDS), np.int32)
    with runner.source.x64():
        text = runner._decode.lower(runner.source.params, runner.pages, runner.seen, idle, 4).compile().as_text()
    shapes = {f"f32[{','.join(map(str, p.shape))}]" for p in jax.tree.leaves(runner.pages)}
    lines = text.splitlines()
    assert any("while(" in line for line in lines)
    assert [line for line in lines if " copy(" in line and any(s in line.split(" copy(")[0] for s in shapes)] == []
    expected = _expected("llama_gqa_torch")
    prompt, tokens = expected["prompts"][1], expected["tokens"][1]
    rid = engine.add_request(prompt, SamplingParams(max_tokens=len(tokens) - len(prompt)))
    engine.run_to_completion()
    assert prompt + engine.tokens(rid) == tokens
