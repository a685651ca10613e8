"""onnx2jax.generate on 1 device against onnxruntime-genai's STORED greedy tokens (tests/data/genai/README.md).

Each fixture's Decoder is made once per module; every prompt width compiles one prefill, every batch size one
decode step.
"""

import dataclasses
import json
import pathlib
import shutil

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.errors import SearchOptionError
from onnx2jax.genai_config import GenaiConfigError
from onnx2jax.runtime.decoder import Decoder
from onnx2jax.runtime.generate import QUADRATIC_NOTE, Generator

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
BUILDER = ["llama_gqa", "llama_mqa", "qwen2_window", "llama_gqa_int4"]
ALL = BUILDER + ["llama_gqa_torch"]
TORCH_PAD = 3  # the torch export has no genai_config.json: expected_tokens.json's model.pad_token_id


def expected(name: str) -> dict:
    return json.loads((GENAI / name / "expected_tokens.json").read_text())


@pytest.fixture(scope="module")
def decoders():
    made: dict[str, Decoder] = {}

    def get(name: str) -> Decoder:
        if name not in made:
            made[name] = onnx2jax.load(GENAI / name)
        return made[name]

    return get


def pad_of(name: str) -> int | None:
    return TORCH_PAD if name == "llama_gqa_torch" else None


@pytest.mark.parametrize("name", ALL)
def test_greedy_tokens_equal_onnxruntime_genai_single_and_batched(name, decoders):
    want = expected(name)
    decoder = decoders(name)
    for prompt, tokens in zip(want["prompts"], want["tokens"]):
        got = onnx2jax.generate(decoder, prompt, max_length=want["max_length"], pad_token_id=pad_of(name))
        assert got.tolist() == [tokens]
    batch = want["batch_right_padded" if name in BUILDER else "batch_left_padded"]["tokens"]
    got = onnx2jax.generate(decoder, want["prompts"], max_length=want["max_length"], pad_token_id=pad_of(name))
    assert got.tolist() == batch
    assert decoder.layout.kind == ("shared" if name in BUILDER else "concat")


def test_a_padded_array_of_prompts_is_read_as_onnxruntime_genai_reads_it(decoders):
    """A 2-D array's pad_token_id at the ends of a row is padding: the batch genai was given, as an array."""
    want = expected("llama_gqa")
    padded = np.array([row[:12] for row in want["batch_right_padded"]["tokens"]])
    got = onnx2jax.generate(decoders("llama_gqa"), padded, max_length=want["max_length"])
    assert got.tolist() == want["batch_right_padded"]["tokens"]


@pytest.mark.parametrize("name", BUILDER)
def test_eos_stops_as_onnxruntime_genai_does(name, decoders):
    """A single run ends before its eos; a batch row keeps it and is padded while the others go on."""
    want = expected(name)
    eos = want["eos_override"]
    decoder = decoders(name)
    for prompt, tokens in zip(want["prompts"], eos["tokens"]):
        got = onnx2jax.generate(decoder, prompt, max_length=want["max_length"], eos_token_id=eos["eos_token_id"])
        assert got.tolist() == [tokens]
    got = onnx2jax.generate(decoder, want["prompts"], max_length=want["max_length"], eos_token_id=eos["eos_token_id"])
    assert got.tolist() == eos["batch_right_padded"]


def test_decode_compiles_once_and_the_cache_is_donated(decoders):
    decoder = decoders("llama_gqa")
    want = expected("llama_gqa")
    before = dict(decoder.traces)
    generator = Generator(decoder, want["prompts"][0], max_length=want["max_length"])
    program = decoder.decode(generator.search)
    executables = program.executables()  # 0, or 1 where an earlier test ran a batch of 1 at this capacity
    generator.generate_next_token()  # the prefill
    generator.generate_next_token()
    cache = generator._cache
    generator.generate_next_token()
    assert all(c.is_deleted() for c in cache)  # donated: the step wrote into it and gave it back
    with decoder.x64():
        compiled = decoder.decode(generator.search).lower(
            decoder.params, generator._cache, generator._state, generator._token, np.int32(1)
        ).compile()
    assert compiled.memory_analysis().alias_size_in_bytes >= sum(c.nbytes for c in generator._cache)  # in place
    for _ in generator:
        pass
    # a second run of the same batch and capacity, another prompt width and another eos: no new decode program
    onnx2jax.generate(decoder, want["prompts"][2], max_length=want["max_length"], eos_token_id=7)
    assert generator.sequences.tolist() == [want["tokens"][0]]
    assert decoder.traces["decode"] - before["decode"] <= 1  # 26 + 29 decode steps, one trace at most
    assert program.executables() - executables <= 1  # and one executable


def test_the_decode_loop_updates_a_concatenated_cache_in_place_without_copying_it(decoders):
    """A torch export concatenates past and new keys: the decode loop reads the old cache there and writes the
    new position in place. XLA CPU's default copy insertion copied each cache array twice a step for that (8
    copies of [1, 2, 7, 16] here; 48 of the whole 10 MB cache a step on GPT-2 small, whose temporaries glibc kept
    and RSS crept with); with region analysis (``xla_options.IN_PLACE_LOOP_FLAG``) none, counted in the
    compiled HLO."""
    decoder = decoders("llama_gqa_torch")
    want = expected("llama_gqa_torch")
    generator = Generator(decoder, want["prompts"][2], max_new_tokens=4, pad_token_id=TORCH_PAD)
    generator.generate_next_token()  # the prefill
    with decoder.x64():
        compiled = decoder.decode(generator.search).lower(
            decoder.params, generator._cache, generator._state, generator._token, np.int32(1)
        ).compile()
    shapes = {f"f32[{','.join(map(str, c.shape))}]" for c in generator._cache}
    lines = compiled.as_text().splitlines()
    assert any("while(" in line for line in lines)
    copies = [line for line in lines if " copy(" in line and any(s in line.split(" copy(")[0] for s in shapes)]
    assert copies == []
    assert [int(t[0]) for t in generator] == want["tokens"][2][len(want["prompts"][2]) + 1:][:3]


def test_the_sampling_key_is_jaxs_made_without_a_program():
    """``Generator``'s key is made on the host (no program compiled on the first token's path), equal to
    ``jax.random.PRNGKey``'s for every 32-bit seed, the edges and negative seeds included."""
    from onnx2jax.runtime.generate import _prng_key

    for seed in (0, 1, 28, 12345, 2**31 - 1, -1, -5, -(2**31)):
        got, want = _prng_key(seed), jax.random.PRNGKey(seed)
        assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want)), seed


def test_streaming_yields_each_new_token(decoders):
    want = expected("llama_gqa_torch")
    generator = Generator(decoders("llama_gqa_torch"), want["prompts"][2], max_new_tokens=6, pad_token_id=TORCH_PAD)
    streamed = [int(t[0]) for t in generator]
    assert streamed == want["tokens"][2][2:8]
    assert generator.is_done() and generator.sequences.tolist() == [want["tokens"][2][:8]]


def _count_steps(monkeypatch, program) -> list[int]:
    """The steps asked of each call of ``program`` (the decode program's last argument), as it is called."""
    asked: list[int] = []
    jitted = program._jitted

    def counting(*args):
        asked.append(int(args[-1]))
        return jitted(*args)

    counting._cache_size = jitted._cache_size  # Program.executables reads it
    monkeypatch.setattr(program, "_jitted", counting)
    return asked


def test_iteration_yields_each_token_before_the_next_step_runs(decoders, monkeypatch):
    """Streaming streams (issue 29 item 3): token k is on the host and yielded before the decode program runs
    step k+1 (its calls counted: one step each); generate(), which nobody watches, runs 16 steps a call; both
    give onnxruntime-genai's stored tokens."""
    want = expected("llama_gqa")
    decoder = decoders("llama_gqa")
    prompt, stored = want["prompts"][1], want["tokens"][1]
    generator = Generator(decoder, prompt, max_length=want["max_length"])
    asked = _count_steps(monkeypatch, decoder.decode(generator.search))
    streamed = []
    for token in generator:
        streamed.append(int(token[0]))
        assert asked == [1] * (len(streamed) - 1)  # token 0 is the prefill's; token k, decode call k's
    assert prompt + streamed == stored
    asked.clear()
    assert onnx2jax.generate(decoder, prompt, max_length=want["max_length"]).tolist() == [stored]
    assert asked == [16, len(stored) - len(prompt) - 1 - 16]  # 19 decode steps in two calls


def test_compile_decode_leaves_nothing_to_compile_in_the_timed_decode(decoders, monkeypatch):
    """The CLI times the decode after Generator.compile_decode (one step run on a copy of the state): the decode
    that follows compiles nothing (XLA's compile events counted), whatever ran before, and its tokens are
    onnxruntime-genai's: the step run ahead leaves no trace."""
    want = expected("llama_gqa")
    decoder = decoders("llama_gqa")
    generator = Generator(decoder, want["prompts"][0], max_length=want["max_length"])
    program = decoder.decode(generator.search)
    asked = _count_steps(monkeypatch, program)
    generator.generate_next_token()
    generator.compile_decode()
    ready = program.executables()
    compiles: list[str] = []
    listen = lambda event, duration, **kw: compiles.append(event) if "backend_compile" in event else None
    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        rest = [int(t[0]) for t in generator]
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    assert ready >= 1 and program.executables() == ready and compiles == []
    assert asked == [1] + [1] * len(rest)
    assert generator.sequences.tolist() == [want["tokens"][0]]


def penalized_greedy(name: str, prompt: list[int], steps: int, penalty: float) -> list[int]:
    """Plain onnxruntime, the whole sequence each call, greedy after transformers' repetition penalty in numpy:
    the independent reference of a penalized run (the builder fixtures' 2 layers of 2 KV heads of 16)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(GENAI / name / "model.onnx"), providers=["CPUExecutionProvider"])
    tokens = list(prompt)
    for _ in range(steps):
        feeds = {"input_ids": np.array([tokens], np.int64), "attention_mask": np.ones((1, len(tokens)), np.int64)}
        feeds.update({f"past_key_values.{i}.{p}": np.zeros((1, 2, 0, 16), np.float32) for i in (0, 1)
                      for p in ("key", "value")})
        logits = session.run(["logits"], feeds)[0][0, -1].astype(np.float32)
        seen = np.unique(tokens)
        logits[seen] = np.where(logits[seen] < 0, logits[seen] * penalty, logits[seen] / penalty)
        tokens.append(int(np.argmax(logits)))
    return tokens[len(prompt):]


def test_repetition_penalty_from_the_call_and_from_genai_config(decoders, monkeypatch, capsys):
    """genai_config.json's repetition_penalty is the default, a call (or onnx2jax generate's
    --repetition-penalty) overrides it; the tokens are plain onnxruntime's with the penalty in numpy, and the
    stored greedy ones at 1 (issue 29 item 2)."""
    want = expected("llama_gqa")
    decoder = decoders("llama_gqa")
    prompt, stored, length = want["prompts"][0], want["tokens"][0], want["max_length"]  # the greedy tests' shapes
    reference = penalized_greedy("llama_gqa", prompt, length - len(prompt), 1.3)
    assert prompt + reference != stored  # the penalty changes the tokens
    assert onnx2jax.generate(decoder, prompt, max_length=length, repetition_penalty=1.3)[0].tolist() == prompt + reference
    args = ["generate", str(GENAI / "llama_gqa"), "--prompt-ids", ",".join(map(str, prompt)), "--max-length",
            str(length), "--repetition-penalty", "1.3"]  # the CLI's load gives the handle held here
    assert main(args) == 0
    assert capsys.readouterr().out.splitlines()[0] == " ".join(map(str, prompt)) + " | " + " ".join(map(str, reference))
    layout = decoder.layout
    monkeypatch.setattr(decoder, "layout", dataclasses.replace(layout, search={**layout.search, "repetition_penalty": 1.3}))
    streamed = [int(t[0]) for t in Generator(decoder, prompt, max_length=length)]
    assert streamed == reference
    assert onnx2jax.generate(decoder, prompt, max_length=length, repetition_penalty=1.0)[0].tolist() == stored
    monkeypatch.setattr(decoder, "layout", dataclasses.replace(layout, search={**layout.search, "num_beams": 4}))
    with pytest.raises(SearchOptionError, match="num_beams=4 in .*genai_config.json: beam search is not implemented"):
        Generator(decoder, prompt, max_new_tokens=12)


def test_sampling_is_reproducible_with_a_seed_and_differs_across_seeds(decoders):
    decoder = decoders("llama_gqa")
    prompts = expected("llama_gqa")["prompts"]

    def run(seed):
        return onnx2jax.generate(decoder, prompts, max_length=32, do_sample=True, temperature=1.5, seed=seed)

    first = run(1)
    traced = dict(decoder.traces)
    again, other = run(1), run(2)
    assert np.array_equal(first, again)
    streamed = Generator(decoder, prompts, max_length=32, do_sample=True, temperature=1.5, seed=1)
    for _ in streamed:  # one step a call: the same keys as 16 a call
        pass
    assert np.array_equal(streamed.sequences, first)
    assert not np.array_equal(first, other)
    greedy = expected("llama_gqa")["batch_right_padded"]["tokens"]
    assert first.tolist() != greedy
    top1 = onnx2jax.generate(decoder, prompts, max_length=32, do_sample=True, top_k=1, seed=5)
    tiny_p = onnx2jax.generate(decoder, prompts, max_length=32, do_sample=True, top_p=1e-6, seed=5)
    assert top1.tolist() == greedy  # top_k=1 leaves only the greedy choice, and so does a tiny top_p
    assert tiny_p.tolist() == greedy
    assert decoder.traces == traced  # seed, temperature, top_k and top_p are data: nothing compiled again


def test_a_model_without_cache_recomputes_with_a_note(tmp_path):
    """The torch export with its past bound to empty tensors and its presents dropped: no cache inputs."""
    proto = onnx.load(GENAI / "llama_gqa_torch" / "model.onnx")
    graph = proto.graph
    past = [i for i in graph.input if i.name.startswith("past_key_values")]
    nodes = [
        oh.make_node("Shape", ["input_ids"], ["nc_shape"], start=0, end=1),
        oh.make_node("Concat", ["nc_shape", "nc_rest"], ["nc_dims"], axis=0),
        oh.make_node("ConstantOfShape", ["nc_dims"], ["nc_empty"],
                     value=oh.make_tensor("zero", onnx.TensorProto.FLOAT, [1], [0.0])),
    ] + [oh.make_node("Identity", ["nc_empty"], [p.name]) for p in past]
    graph.initializer.append(onnx.numpy_helper.from_array(np.array([2, 0, 16], np.int64), "nc_rest"))
    for p in past:
        graph.input.remove(p)
    for o in [o for o in graph.output if o.name.startswith("present")]:
        graph.output.remove(o)
    everything = nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(everything)
    path = tmp_path / "no_cache.onnx"
    onnx.save(proto, path)
    want = expected("llama_gqa_torch")
    with pytest.warns(UserWarning, match="quadratic"):
        got = onnx2jax.generate(path, want["prompts"], max_new_tokens=3, pad_token_id=TORCH_PAD)
    assert got.tolist() == [row[:15] for row in want["batch_left_padded"]["tokens"]]
    assert "export it with a cache" in QUADRATIC_NOTE


def test_a_prompt_longer_than_the_context_is_refused_by_name(decoders):
    decoder = decoders("llama_gqa")
    with pytest.raises(ValueError, match=r"prompt has 300 tokens, longer than the model's context of 256 "
                                         r"\(context_length in .*genai_config.json\)"):
        Generator(decoder, [1] * 300)
    with pytest.raises(ValueError, match="max_length 400 is beyond the model's context of 256"):
        Generator(decoder, [1, 2], max_length=400)
    with pytest.raises(ValueError, match="give max_length or max_new_tokens"):
        Generator(decoders("llama_gqa_torch"), [1, 2])


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["model"]["decoder"].update(num_key_value_heads=4),
     r"num_key_value_heads is 4 in the config, model.onnx's input 'past_key_values.0.key' has 2"),
    (lambda c: c["model"]["decoder"].update(num_hidden_layers=3),
     r"num_hidden_layers is 3 \(6 cache inputs\) in the config, the model has 4 cache inputs"),
    (lambda c: c["model"]["decoder"]["inputs"].update(past_key_names="past.%d.k"),
     r"the config names input 'past.0.k'"),
    (lambda c: c["model"]["decoder"].update(num_attention_heads=4),
     r"num_attention_heads is 4 in the config, model.onnx's GroupQueryAttention node .* has num_heads=8"),
])
def test_a_folder_whose_config_and_model_disagree_is_refused_naming_both(tmp_path, edit, message):
    folder = tmp_path / "llama_gqa"
    shutil.copytree(GENAI / "llama_gqa", folder)
    config = json.loads((folder / "genai_config.json").read_text())
    edit(config)
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(GenaiConfigError, match="genai_config.json and model.onnx disagree: " + message):
        onnx2jax.load(folder)


def test_generate_is_exported_lazily():
    assert onnx2jax.generate.__module__ == "onnx2jax.runtime.generate"
    assert onnx2jax.Generator is Generator
