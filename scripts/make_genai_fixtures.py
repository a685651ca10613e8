"""Make the onnxruntime-genai LLM fixtures under tests/data/genai/ (issue 20).

CI compares onnx2jax's generation with the token ids stored here and never installs
onnxruntime-genai, torch or transformers. This script is the only place they are needed.

Fixtures (tiny random-weight decoders, fixed seeds, one byte-level BPE tokenizer trained here):

- ``llama_gqa``       LlamaForCausalLM, 8 query heads / 2 KV heads, model builder, fp32.
- ``llama_mqa``       LlamaForCausalLM, 4 query heads / 1 KV head (multi-query), builder, fp32.
- ``qwen2_window``    Qwen2ForCausalLM, layer 0 full attention, layer 1 a sliding window of 8
                      (shorter than the test sequences; GroupQueryAttention local_window_size=8),
                      q/k/v biases, builder, fp32, built with ``windowed_kv_cache=false`` so
                      every layer's cache has the full context length.
- ``llama_gqa_int4``  the int4 (MatMulNBits, block 32, accuracy_level=1) build of ``llama_gqa``.
- ``llama_gqa_torch`` ``torch.onnx.export`` of ``llama_gqa``'s weights with a cache
                      (``past_key_values.N.key/value`` in, ``present.N.key/value`` out), plain
                      ONNX ops only; its tokens come from transformers' ``generate``.

Every folder gets ``expected_tokens.json`` (onnxruntime-genai's greedy tokens, prompt included;
transformers' for the torch export; checked against a plain onnxruntime greedy loop),
``forward.npz`` (one plain onnxruntime forward call with a non-empty past: inputs, logits,
presents) and ``forward_batch.npz`` (a padded batch's prefill and decode step).
tests/data/genai/README.md describes them.

Install (a separate virtualenv, not --system-site-packages; never a CUDA torch: torch first,
as a CPU-only wheel, so that nothing later pulls the CUDA build and its nvidia-* packages)::

    python -m venv /work/venvs/fixtures
    # the CPU wheel on these machines (pip's find-links folder); elsewhere:
    #   pip install torch==2.13.0 --index-url <PyTorch's CPU wheel index>
    /work/venvs/fixtures/bin/pip install /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
    /work/venvs/fixtures/bin/pip install numpy onnx onnxruntime onnxruntime-genai onnx-ir \\
        onnxscript transformers tokenizers
    /work/venvs/fixtures/bin/pip list | grep -i nvidia    # must print nothing

Versions used for the stored fixtures: torch 2.13.0+cpu, transformers 5.24.0, onnxruntime 1.32.0,
onnxruntime-genai 0.18.0, onnx 1.23.2, tokenizers 0.23.3.

Run from the repository root::

    /work/venvs/fixtures/bin/python scripts/make_genai_fixtures.py [--only NAME ...]
    /work/venvs/fixtures/bin/python scripts/make_genai_fixtures.py --medium /tmp/genai_medium
    /work/venvs/fixtures/bin/python scripts/make_genai_fixtures.py --real bench/models/genai_real

One folder per builder architecture (tests/data/genai/arch/) comes from the sibling
scripts/make_genai_arch_fixtures.py, which reuses this script's helpers and virtualenv.

The second builds, outside the repository, the benchmark's medium model (6 layers, width 512,
8 query / 2 KV heads of 64, context 1024, about 17M parameters): fp32 and int4 builder folders
with the same stored tokens and forward calls. The third, the real-width model (8 layers, width 1024,
FFN 2816, 16 query / 4 KV heads of 64, about 100M parameters; int4 at the builder's CPU default
accuracy_level 4) for bench/bench_generate.py (issue 30).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT_ROOT = ROOT / "tests" / "data" / "genai"

VOCAB_SIZE = 512
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
BOS_ID, EOS_ID, PAD_ID = 1, 2, 3

# Prompts of different lengths (token ids); the batch run pads them to the longest.
PROMPTS: list[list[int]] = [
    [1, 17, 230, 45, 9],
    [1, 300, 12, 77, 401, 5, 88, 19, 250, 33, 64, 128],
    [1, 42],
]
MAX_LENGTH = 32
# The forward.npz call: a past of PAST_LEN positions, then NEW_LEN new tokens.
PAST_LEN, NEW_LEN = 6, 3


TEXT_EXAMPLE = "the small model writes text"


def make_tokenizer(folder: Path) -> None:
    """Save a byte-level BPE tokenizer of exactly VOCAB_SIZE tokens, trained here on made-up
    words (no network, no download); byte-level BPE is what onnxruntime-genai's own tokenizer
    reads too (it rejects a WordLevel one)."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rnd = random.Random(0)
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = ["the", "small", "model", "writes", "text"]
    words += ["".join(rnd.choice(syllables) for _ in range(rnd.randint(1, 3))) for _ in range(400)]
    corpus = [" ".join(rnd.choice(words) for _ in range(12)) for _ in range(2000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, not {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)


def text_example(folder: Path) -> dict[str, Any]:
    """TEXT_EXAMPLE's ids by the folder's tokenizer.json (and by onnxruntime-genai's tokenizer,
    which must agree, for builder folders)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(folder / "tokenizer.json")).encode(TEXT_EXAMPLE).ids
    if (folder / "genai_config.json").exists():
        import onnxruntime_genai as og

        genai_ids = [int(i) for i in og.Tokenizer(og.Model(str(folder))).encode(TEXT_EXAMPLE)]
        if genai_ids != ids:
            raise RuntimeError(f"tokenizers {ids} != onnxruntime-genai {genai_ids}")
    return {"text": TEXT_EXAMPLE, "ids": ids}


def hf_config(arch: str) -> Any:
    """The transformers config of one architecture ('llama_gqa', 'llama_mqa', 'qwen2_window', 'llama_medium',
    'llama_real')."""
    import transformers

    common = dict(
        vocab_size=VOCAB_SIZE,
        num_hidden_layers=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        tie_word_embeddings=False,
        # Larger than the default 0.02 so that greedy choices have clear margins.
        initializer_range=0.15,
    )
    if arch == "llama_gqa":
        return transformers.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_attention_heads=8, num_key_value_heads=2, head_dim=16, **common
        )
    if arch == "llama_mqa":
        return transformers.LlamaConfig(
            hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=1, head_dim=32, **common
        )
    if arch == "llama_medium":
        # for bench/ only (about 17M parameters; not stored in the repository)
        return transformers.LlamaConfig(
            hidden_size=512, intermediate_size=1408, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
            **{**common, "num_hidden_layers": 6, "max_position_embeddings": 1024, "initializer_range": 0.05},
        )
    if arch == "llama_real":
        # for bench/ only (issue 30): a real model's width (1024, FFN 2816, 16/4 heads), 8 layers, ~90M parameters
        # in the layers; random weights, not stored in the repository
        return transformers.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4, head_dim=64,
            **{**common, "num_hidden_layers": 8, "max_position_embeddings": 1024, "initializer_range": 0.03},
        )
    if arch == "qwen2_window":
        # layer 0 full attention, layer 1 a sliding window of 8 (layer_types); q/k/v have biases.
        return transformers.Qwen2Config(
            hidden_size=128,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=8,
            max_window_layers=1,
            **common,
        )
    raise ValueError(arch)


def make_hf_model(arch: str, seed: int, folder: Path) -> Any:
    """Random-weight model saved with save_pretrained (plus the tokenizer) into `folder`."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = hf_config(arch)
    config._attn_implementation = "eager"
    cls = transformers.Qwen2ForCausalLM if arch.startswith("qwen2") else transformers.LlamaForCausalLM
    model = cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            # transformers initialises biases (qwen2's q/k/v) to 0 and norms to 1: randomise
            # them so that the fixtures exercise them.
            if name.endswith("bias"):
                param.normal_(0.0, 0.5)
            elif name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
        # Logits ~4x larger than the init gives: greedy choices further from ties (see
        # min_top1_top2_logit_gap in expected_tokens.json), so sharded runs' rounding can't flip them.
        model.lm_head.weight.mul_(4.0)
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(folder)
    make_tokenizer(folder)
    return model


def run_builder(hf_folder: Path, out: Path, precision: str, extra: dict[str, str]) -> None:
    """onnxruntime-genai's model builder, CPU execution provider."""
    cache = hf_folder.parent / "cache"
    cmd = [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(hf_folder), "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache),
    ]
    if extra:
        cmd += ["--extra_options", *[f"{k}={v}" for k, v in extra.items()]]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def genai_generate(folder: Path, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """onnxruntime-genai greedy generation, one prompt (batch 1) at a time."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    out = []
    for prompt in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=max_length, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.array([prompt], dtype=np.int32))
        while not gen.is_done():
            gen.generate_next_token()
        out.append([int(t) for t in gen.get_sequence(0)])
    return out


def genai_generate_batch(folder: Path, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """onnxruntime-genai greedy generation of the prompts as one RIGHT-padded batch.

    onnxruntime-genai takes a GroupQueryAttention model's batch right-padded with pad_token_id
    (left padding changes the tokens of the short prompts); the sequences it returns keep the
    pads between each prompt and its new tokens, and max_length counts them.
    """
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), PAD_ID, dtype=np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(prompts))
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    while not gen.is_done():
        gen.generate_next_token()
    return [[int(t) for t in gen.get_sequence(i)] for i in range(len(prompts))]


def genai_eos_runs(folder: Path, singles: list[list[int]], work: Path) -> dict[str, Any]:
    """onnxruntime-genai's greedy runs with eos_token_id set to a token of the first prompt's
    continuation (the stored runs never reach eos 2): where it stops, whether the eos token is
    returned, and what a batch does with rows that stopped early."""
    prompt_len = len(PROMPTS[0])
    eos = singles[0][prompt_len + 4]
    copy = work / f"eos_{folder.name}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(folder, copy)
    config = json.loads((copy / "genai_config.json").read_text())
    config["model"]["eos_token_id"] = eos
    (copy / "genai_config.json").write_text(json.dumps(config, indent=4))
    return {
        "eos_token_id": eos,
        "tokens": genai_generate(copy, PROMPTS, MAX_LENGTH),
        "batch_right_padded": genai_generate_batch(copy, PROMPTS, MAX_LENGTH),
    }


def versions() -> dict[str, str]:
    """The versions of the packages that made a fixture (stored in expected_tokens.json)."""
    import onnx
    import onnxruntime
    import onnxruntime_genai
    import torch
    import transformers

    return {
        "onnxruntime_genai": onnxruntime_genai.__version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def ort_session(path: Path) -> Any:
    """A plain onnxruntime CPU session, one intra-op thread (as the tests run it)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def step_feeds(sess: Any, ids: np.ndarray, start: int, past: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds of one batch-1 call on `ids` (positions start..), given the past of `start` positions."""
    total = start + ids.shape[1]
    feeds: dict[str, np.ndarray] = {}
    for info in sess.get_inputs():
        dtype = np.int32 if "int32" in info.type else np.int64
        if info.name == "input_ids":
            feeds[info.name] = ids.astype(dtype)
        elif info.name == "attention_mask":
            feeds[info.name] = np.ones((1, total), dtype)
        elif info.name == "position_ids":
            feeds[info.name] = np.arange(start, total, dtype=dtype)[None]
        elif info.name.startswith("past_key_values"):
            feeds[info.name] = past[info.name]
        else:
            raise ValueError(f"unexpected input {info.name}")
    return feeds


def empty_past(sess: Any, kv_heads: int, head_size: int) -> dict[str, np.ndarray]:
    """A batch-1 past of 0 positions for every cache input (the prefill's)."""
    return {
        i.name: np.zeros((1, kv_heads, 0, head_size), np.float32)
        for i in sess.get_inputs()
        if i.name.startswith("past_key_values")
    }


def presents_as_past(sess: Any, outputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """A call's present.N.* outputs under the next call's past_key_values.N.* names."""
    names = [o.name for o in sess.get_outputs()]
    return {n.replace("present", "past_key_values"): v for n, v in zip(names, outputs) if n.startswith("present")}


def ort_greedy(folder: Path, prompt: list[int], max_length: int, kv_heads: int, head_size: int) -> tuple[list[int], float]:
    """Greedy tokens of a plain onnxruntime loop (prefill, then one token a step), and the smallest
    gap between the best and second-best logit over the chosen tokens (how far from a tie)."""
    sess = ort_session(folder / "model.onnx")
    tokens = list(prompt)
    past = empty_past(sess, kv_heads, head_size)
    new = np.array([prompt])
    margin = float("inf")
    while len(tokens) < max_length:
        outputs = sess.run(None, step_feeds(sess, new, len(tokens) - new.shape[1], past))
        last = outputs[0][0, -1]
        top2 = np.sort(last)[-2:]
        margin = min(margin, float(top2[1] - top2[0]))
        tokens.append(int(np.argmax(last)))
        if tokens[-1] == EOS_ID:
            break
        past = presents_as_past(sess, outputs)
        new = np.array([[tokens[-1]]])
    return tokens, margin


def ort_greedy_check(folder: Path, expected: list[list[int]], kv_heads: int, head_size: int) -> dict[str, Any]:
    """Whether a plain onnxruntime greedy loop gives the stored tokens, and the tokens' margins."""
    runs = [ort_greedy(folder, p, MAX_LENGTH, kv_heads, head_size) for p in PROMPTS]
    return {
        "equals_tokens": [r[0] == e for r, e in zip(runs, expected)],
        "min_top1_top2_logit_gap": [round(r[1], 5) for r in runs],
    }


def forward_npz(folder: Path, kv_heads: int, head_size: int, model_file: str = "model.onnx") -> None:
    """One plain onnxruntime forward call with a past of PAST_LEN positions -> forward.npz.

    The past is the model's own present of a first call on PAST_LEN tokens, so that the stored
    call is a real decode/chunk step; inputs are stored under their ONNX names, outputs under
    ``out:<name>``.
    """
    sess = ort_session(folder / model_file)
    rng = np.random.default_rng(0)
    tokens = rng.integers(4, VOCAB_SIZE, size=(1, PAST_LEN + NEW_LEN), dtype=np.int64)
    first = sess.run(None, step_feeds(sess, tokens[:, :PAST_LEN], 0, empty_past(sess, kv_heads, head_size)))
    call = step_feeds(sess, tokens[:, PAST_LEN:], PAST_LEN, presents_as_past(sess, first))
    outs = sess.run(None, call)
    arrays = dict(call)
    arrays.update({f"out:{o.name}": v for o, v in zip(sess.get_outputs(), outs)})
    np.savez_compressed(folder / "forward.npz", **arrays)


def forward_batch_npz(folder: Path, kv_heads: int, head_size: int, right_padded: bool) -> None:
    """A padded batch of 2 through plain onnxruntime -> forward_batch.npz: a prefill of rows of 5
    and 3 tokens (empty past), then one decode step of one token per row on its presents.

    Builder models (GroupQueryAttention) take the batch right-padded, as onnxruntime-genai feeds
    it: GQA reads only the mask's row sums (seqlens_k) and width, and writes each row's new key
    and value at the row's own length, over the pad. The torch export takes it left-padded, with
    mask 0 on the pads and positions counted from each row's first token (transformers' way).
    Keys: ``prefill:<input>``, ``prefill:out:<output>``, ``decode:<input>``, ``decode:out:<output>``.
    """
    sess = ort_session(folder / "model.onnx")
    types = {i.name: np.int32 if "int32" in i.type else np.int64 for i in sess.get_inputs()}
    rows = [[1, 57, 301, 12, 480], [1, 222, 9]]
    width = 5
    ids = np.full((2, width), PAD_ID, np.int64)
    mask = np.zeros((2, width), np.int64)
    for r, row in enumerate(rows):
        cols = slice(0, len(row)) if right_padded else slice(width - len(row), width)
        ids[r, cols], mask[r, cols] = row, 1
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    past = {n: np.zeros((2, kv_heads, 0, head_size), np.float32) for n in types if n.startswith("past_key_values")}
    arrays: dict[str, np.ndarray] = {}
    for step in ("prefill", "decode"):
        feeds = {"input_ids": ids.astype(types["input_ids"]), "attention_mask": mask.astype(types["attention_mask"])}
        if "position_ids" in types:
            feeds["position_ids"] = positions.astype(types["position_ids"])
        feeds.update(past)
        outs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        arrays.update({f"{step}:{k}": v for k, v in feeds.items()})
        arrays.update({f"{step}:out:{k}": v for k, v in outs.items()})
        last = mask.sum(axis=1) - 1 if right_padded and step == "prefill" else np.full(2, ids.shape[1] - 1)
        next_ids = outs["logits"][np.arange(2), last].argmax(axis=-1)
        lengths = mask.sum(axis=1)
        ids = next_ids[:, None].astype(np.int64)
        positions = lengths[:, None]
        if right_padded:
            # each row's real tokens first, then pads: the layout GQA leaves in the cache
            mask = (np.arange(width + 1)[None] < (lengths + 1)[:, None]).astype(np.int64)
        else:
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        past = presents_as_past(sess, [outs[o.name] for o in sess.get_outputs()])
    np.savez_compressed(folder / "forward_batch.npz", **arrays)


def write_json(path: Path, obj: Any) -> None:
    """Indented JSON with each list of numbers on one line (readable token rows)."""
    text = json.dumps(obj, indent=1)
    text = re.sub(r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    path.write_text(text + "\n")


def builder_fixture(
    name: str, arch: str, seed: int, precision: str, extra: dict[str, str], work: Path, out_root: Path = OUT_ROOT
) -> None:
    """One builder folder under out_root: the model, genai_config.json, tokenizer, stored tokens, forward calls."""
    hf = work / f"hf_{arch}_{seed}"
    if not hf.exists():
        make_hf_model(arch, seed, hf)
    out = out_root / name
    shutil.rmtree(out, ignore_errors=True)
    run_builder(hf, out, precision, extra)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        # the builder re-saves the tokenizer through the architecture's tokenizer class (Qwen2's
        # adds byte-level pre-tokenization that breaks the made-up vocabulary): keep ours
        shutil.copy(hf / f, out / f)
    singles = genai_generate(out, PROMPTS, MAX_LENGTH)
    batch = genai_generate_batch(out, PROMPTS, MAX_LENGTH)
    eos_runs = genai_eos_runs(out, singles, work)
    write_json(
        out / "expected_tokens.json",
        {
            "source": "onnxruntime-genai greedy (do_sample=False), one prompt per generator",
            "prompts": PROMPTS,
            "max_length": MAX_LENGTH,
            "tokens": singles,
            "batch_right_padded": {"pad_token_id": PAD_ID, "tokens": batch},
            "eos_override": eos_runs,
            "hf": {"architecture": arch, "seed": seed, "config": hf_config(arch).to_dict()},
            "builder": {"precision": precision, "execution_provider": "cpu", "extra_options": extra},
            "versions": versions(),
        },
    )
    decoder = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    kv_heads, head_size = decoder["num_key_value_heads"], decoder["head_size"]
    expected = json.loads((out / "expected_tokens.json").read_text())
    expected["onnxruntime_greedy_loop"] = ort_greedy_check(out, singles, kv_heads, head_size)
    expected["text_example"] = text_example(out)
    write_json(out / "expected_tokens.json", expected)
    forward_npz(out, kv_heads, head_size)
    forward_batch_npz(out, kv_heads, head_size, right_padded=True)


def export_torch_with_cache(model: Any, path: Path) -> None:
    """torch.onnx.export (dynamo) of a 2-layer causal LM with flat past/present tensors."""
    import torch
    import transformers

    layers = model.config.num_hidden_layers
    if layers != 2:
        raise ValueError("the wrapper below spells out the cache of exactly 2 layers")

    class Wrapper(torch.nn.Module):
        def __init__(self, lm: Any) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, pk0, pv0, pk1, pv1):  # noqa: ANN001
            cache = transformers.DynamicCache(config=self.lm.config)
            for i, (k, v) in enumerate([(pk0, pv0), (pk1, pv1)]):
                cache.update(k, v, i)
            out = self.lm(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
            )
            presents = []
            for layer in out.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    cfg = model.config
    kv, hd = cfg.num_key_value_heads, cfg.head_dim
    batch, seq, past_len = 2, 3, 4
    args = (
        torch.randint(4, VOCAB_SIZE, (batch, seq)),
        torch.ones(batch, past_len + seq, dtype=torch.int64),
        torch.arange(past_len, past_len + seq)[None].expand(batch, seq),
        *[torch.randn(batch, kv, past_len, hd) for _ in range(2 * layers)],
    )
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    names_in = ["input_ids", "attention_mask", "position_ids", *past_names]
    names_out = ["logits", *[n.replace("past_key_values", "present") for n in past_names]]
    dynamic = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        **{n: {0: "batch_size", 2: "past_sequence_length"} for n in past_names},
    }
    with torch.no_grad():
        torch.onnx.export(
            Wrapper(model).eval(),
            args,
            str(path),
            input_names=names_in,
            output_names=names_out,
            dynamic_axes=dynamic,
            opset_version=18,
            dynamo=True,
            external_data=False,
        )
    import onnx

    exported = onnx.load(str(path))
    for node in exported.graph.node:
        # torch's stack traces name this machine's paths
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(exported, str(path))


def transformers_generate(model: Any, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """transformers' greedy generate, one prompt at a time."""
    import torch

    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_length=max_length, do_sample=False)
            out.append([int(t) for t in seq[0]])
    return out


def transformers_generate_left_padded(model: Any, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """transformers' greedy generate of the prompts as one LEFT-padded batch (mask 0 on pads)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), PAD_ID)
    mask = torch.zeros((len(prompts), width), dtype=torch.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    with torch.no_grad():
        seq = model.generate(ids, attention_mask=mask, max_length=max_length, do_sample=False)
    return [[int(t) for t in row] for row in seq]


def torch_fixture(name: str, arch: str, seed: int, work: Path) -> None:
    """The torch export with a cache of the same weights as the builder fixture of (arch, seed)."""
    hf = work / f"hf_{arch}_{seed}"
    model = make_hf_model(arch, seed, hf)
    out = OUT_ROOT / name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    export_torch_with_cache(model, out / "model.onnx")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf / f, out / f)
    tokens = transformers_generate(model, PROMPTS, MAX_LENGTH)
    genai_file = OUT_ROOT / arch / "expected_tokens.json"
    genai_tokens = json.loads(genai_file.read_text())["tokens"] if genai_file.exists() else None
    cfg = model.config
    write_json(
        out / "expected_tokens.json",
        {
            "source": "transformers generate (greedy, do_sample=False), one prompt per call",
            "prompts": PROMPTS,
            "max_length": MAX_LENGTH,
            "tokens": tokens,
            "equals_genai_tokens_of": {arch: tokens == genai_tokens},
            "batch_left_padded": {
                "pad_token_id": PAD_ID,
                "tokens": transformers_generate_left_padded(model, PROMPTS, MAX_LENGTH),
            },
            "model": {
                "num_hidden_layers": cfg.num_hidden_layers,
                "num_attention_heads": cfg.num_attention_heads,
                "num_key_value_heads": cfg.num_key_value_heads,
                "head_size": cfg.head_dim,
                "vocab_size": cfg.vocab_size,
                "context_length": cfg.max_position_embeddings,
                "eos_token_id": EOS_ID,
                "pad_token_id": PAD_ID,
            },
            "hf": {"architecture": arch, "seed": seed, "config": cfg.to_dict()},
            "versions": versions(),
        },
    )
    expected = json.loads((out / "expected_tokens.json").read_text())
    expected["onnxruntime_greedy_loop"] = ort_greedy_check(out, tokens, cfg.num_key_value_heads, cfg.head_dim)
    expected["text_example"] = text_example(out)
    write_json(out / "expected_tokens.json", expected)
    forward_npz(out, cfg.num_key_value_heads, cfg.head_dim)
    forward_batch_npz(out, cfg.num_key_value_heads, cfg.head_dim, right_padded=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="fixture names to (re)make")
    parser.add_argument(
        "--medium",
        type=Path,
        default=None,
        help="instead, build the benchmark's medium model (6 layers, width 512, GQA 8/2) as "
        "llama_medium_fp32 and llama_medium_int4 folders under this directory",
    )
    parser.add_argument(
        "--real",
        type=Path,
        default=None,
        help="instead, build the benchmark's real-width model (8 layers, width 1024, FFN 2816, GQA 16/4) as "
        "llama_real_fp32 and llama_real_int4 (the builder's CPU default, accuracy_level 4) under this directory",
    )
    args = parser.parse_args()
    if args.real is not None:
        with tempfile.TemporaryDirectory() as tmp:
            for precision in ("fp32", "int4"):
                print(f"-- llama_real_{precision}", flush=True)
                builder_fixture(f"llama_real_{precision}", "llama_real", 31, precision, {}, Path(tmp), args.real)
        return
    if args.medium is not None:
        with tempfile.TemporaryDirectory() as tmp:
            for precision, extra in (("fp32", {}), ("int4", {"accuracy_level": "1"})):
                print(f"-- llama_medium_{precision}", flush=True)
                builder_fixture(
                    f"llama_medium_{precision}", "llama_medium", 30, precision, extra, Path(tmp), args.medium
                )
        return
    want = set(args.only) if args.only else None
    OUT_ROOT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        specs = [
            ("llama_gqa", "llama_gqa", 20, "fp32", {}),
            ("llama_mqa", "llama_mqa", 21, "fp32", {}),
            ("qwen2_window", "qwen2_window", 22, "fp32", {"windowed_kv_cache": "false"}),
            # accuracy_level=1: MatMulNBits computes in fp32 (the CPU default 4 quantizes the
            # activations to int8, which a dequantize-then-matmul cannot reproduce exactly).
            ("llama_gqa_int4", "llama_gqa", 20, "int4", {"accuracy_level": "1"}),
        ]
        for name, arch, seed, precision, extra in specs:
            if want is None or name in want:
                print(f"-- {name}", flush=True)
                builder_fixture(name, arch, seed, precision, extra, work)
        if want is None or "llama_gqa_torch" in want:
            print("-- llama_gqa_torch", flush=True)
            torch_fixture("llama_gqa_torch", "llama_gqa", 20, work)


if __name__ == "__main__":
    main()
