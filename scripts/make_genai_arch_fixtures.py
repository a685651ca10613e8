"""Make tests/data/genai/arch/: one tiny onnxruntime-genai builder folder per architecture and precision (issue 28).

Each fixture is a random-weight transformers model of one architecture the model builder supports on CPU,
built with ``python -m onnxruntime_genai.models.builder -e cpu``, and onnxruntime-genai's greedy tokens stored
next to it (``expected_tokens.json``); tests/onnx2jax/test_genai_architectures.py generates the same tokens
on 1 and 8 devices. Where the builder (or onnxruntime-genai on its output) fails, the error is recorded in
``FAILURES`` below and in tests/data/genai/arch/README.md, and no folder is stored.

Tiny on purpose: 2 layers, hidden 64, 4 query / 2 KV heads of 16 (onnxruntime's CPU GroupQueryAttention wants
a head size that is a multiple of 16), intermediate 96, vocabulary 256, context 64, about 0.3 MB a folder in
fp32 and 0.1 MB in int4. No tokenizer is stored (the tests feed token ids).

Install: the same virtualenv as scripts/make_genai_fixtures.py (its docstring says how: CPU-only torch
first). Run from the repository root::

    /work/venvs/fixtures/bin/python scripts/make_genai_arch_fixtures.py [--only NAME ...]

Versions used for the stored fixtures: torch 2.13.0+cpu, transformers 5.24.0, onnxruntime 1.32.0,
onnxruntime-genai 0.18.0 (also stored in each expected_tokens.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_genai_fixtures import (  # noqa: E402 - the sibling script's helpers
    OUT_ROOT,
    genai_generate,
    make_tokenizer,
    versions,
    write_json,
)

ARCH_ROOT = OUT_ROOT / "arch"
VOCAB = 256
BOS, EOS, PAD = 1, 2, 3
PROMPTS = [[1, 17, 230, 45, 9], [1, 200, 12, 77, 101, 5, 88, 19, 250, 33, 64, 128], [1, 42]]
MAX_LENGTH = 24
COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=64, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    tie_word_embeddings=False, initializer_range=0.15,
)
# int4: accuracy_level=1 computes MatMulNBits in fp32 (the CPU default 4 quantizes activations to int8).
INT4 = ("int4", {"accuracy_level": "1"})


def _configs() -> dict[str, Callable[[], Any]]:
    """Architecture name -> its transformers config (tiny, random weights)."""
    import transformers as t

    sliding = ["sliding_attention", "full_attention"]
    return {
        "llama": lambda: t.LlamaConfig(head_dim=16, **COMMON),
        "mistral": lambda: t.MistralConfig(head_dim=16, sliding_window=8, **COMMON),
        "qwen2": lambda: t.Qwen2Config(attention_bias=True, **COMMON),
        # pad_token_id = the vocabulary size, written into genai_config.json after the build (the builder loads the
        # transformers model, whose embedding refuses such a padding_idx)
        "qwen2_pad_oov": lambda: t.Qwen2Config(attention_bias=True, **COMMON),
        "qwen3": lambda: t.Qwen3Config(head_dim=16, **COMMON),
        "phi3": lambda: t.Phi3Config(original_max_position_embeddings=64, **COMMON),
        "phi3_longrope": lambda: t.Phi3Config(
            original_max_position_embeddings=32,
            rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                          "long_factor": [1.5 + 0.2 * i for i in range(8)]},
            **COMMON,
        ),
        "gemma": lambda: t.GemmaConfig(head_dim=16, **COMMON),
        # layer 0 local (a window of 8, the builder's ring cache), layer 1 global; soft-capped scores and logits
        "gemma2": lambda: t.Gemma2Config(
            head_dim=16, sliding_window=8, layer_types=sliding, query_pre_attn_scalar=16,
            attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **COMMON,
        ),
        "gemma3": lambda: t.Gemma3TextConfig(
            head_dim=16, sliding_window=8, layer_types=sliding, query_pre_attn_scalar=16, **COMMON
        ),
        "granite": lambda: t.GraniteConfig(
            embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=0.5, **COMMON
        ),
        "olmo": lambda: t.OlmoConfig(clip_qkv=1.5, **COMMON),
        # partial rotary (factor 0.5; phi's too) of heads of 32: onnxruntime's GroupQueryAttention wants a rotary
        # cache of a multiple of 8 columns (heads of 16 give 4: "cos_cache dimension 1 must be <= head_size / 2 and a
        # multiple of 8")
        "nemotron": lambda: t.NemotronConfig(head_dim=32, **COMMON),
        "smollm3": lambda: t.SmolLM3Config(**COMMON),
        "phi": lambda: t.PhiConfig(**{**COMMON, "num_attention_heads": 2}),  # heads of 32 (as nemotron's)
        "ernie4_5": lambda: t.Ernie4_5Config(head_dim=16, **COMMON),
        "olmo2": lambda: t.Olmo2Config(**COMMON),
    }


SEEDS = {name: 40 + i for i, name in enumerate([
    "llama", "mistral", "qwen2", "qwen2_pad_oov", "qwen3", "phi3", "phi3_longrope", "gemma", "gemma2", "gemma3",
    "granite", "olmo", "nemotron", "smollm3", "phi", "ernie4_5", "olmo2",
])}
PRECISIONS = [("fp32", {}), INT4, ("fp16", {}), ("bf16", {})]
# Only these precisions are tried for every architecture; fp16/bf16 once (llama), recorded below.
TRIED = {"fp32", "int4"}

# Where the builder, or onnxruntime-genai on what it wrote, fails (onnxruntime-genai 0.18.0, transformers 5.24.0,
# CPU). Filled by running this script; kept here and in tests/data/genai/arch/README.md.
FAILURES = {
    # worked around (the folders are stored)
    "gemma3_*": "builder: KeyError: 'rope_type' in make_rope_init, then AttributeError: 'Gemma3TextConfig' object "
                "has no attribute 'rope_local_base_freq' (transformers 5's config): built through GEMMA3_SHIM",
    "nemotron_*, phi_*": "with heads of 16 and partial_rotary_factor 0.5, onnxruntime-genai: GroupQueryAttention: "
                         "cos_cache dimension 1 must be <= head_size / 2 and a multiple of 8: built with heads of 32",
    "gemma2_*, gemma3_* batch": "onnxruntime-genai: GroupQueryAttention: seqlens_k[0] = 4 is too small for "
                                "sequence_length 12 (the ring cache refuses a right-padded batch): the batch's "
                                "reference is the windowed_kv_cache=false build of the same weights",
    "qwen2_pad_oov_* batch": "onnxruntime-genai: Gather '/model/embed_tokens/Gather': indices element out of data "
                             "bounds, idx=256 (it gathers the pad of a padded batch): no batch reference",
    # not stored
    "olmo2_*": "builder: NotImplementedError: the model is not currently supported (Olmo2ForCausalLM)",
    "llama_fp16": "onnxruntime-genai on CPU: the builder writes a MultiHeadAttention graph with a float16 cache; "
                  "running it fails: Cast 'InsertedPrecisionFreeCast_/model/layers.1/attn/v_proj/repeat_kv/"
                  "Reshape_4/output_0': Shape mismatch attempting to re-use buffer. {1,1,64} != {1,6,64}",
    "llama_bf16": "onnxruntime-genai on CPU: Could not find an implementation for Where(16) node with name "
                  "'/model/attn_mask_reformat/input_ids_subgraph/Where_2' (no bfloat16 Where on CPU)",
}


def genai_generate_batch(folder: Path, prompts: list[list[int]], max_length: int) -> list[list[int]]:
    """onnxruntime-genai's greedy run of the prompts as one batch right-padded with the folder's pad_token_id
    (as scripts/make_genai_fixtures.py's, which pads with 3)."""
    import numpy as np
    import onnxruntime_genai as og

    pad = json.loads((folder / "genai_config.json").read_text())["model"]["pad_token_id"]
    model = og.Model(str(folder))
    ids = np.full((len(prompts), max(len(p) for p in prompts)), pad, dtype=np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False, batch_size=len(prompts))
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    while not generator.is_done():
        generator.generate_next_token()
    return [[int(t) for t in generator.get_sequence(i)] for i in range(len(prompts))]


def make_hf(name: str, folder: Path) -> None:
    """The random-weight model of one architecture, saved with save_pretrained, and a tokenizer for the builder."""
    import torch
    import transformers

    torch.manual_seed(SEEDS[name])
    config = _configs()[name]()
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for pname, param in model.named_parameters():
            # transformers initialises biases to 0 and norms to 1: randomise them so that the fixtures use them
            if pname.endswith("bias"):
                param.normal_(0.0, 0.5)
            elif "norm" in pname and pname.endswith("weight"):
                low, high = (-0.5, 0.5) if name.startswith("gemma") else (0.5, 1.5)  # gemma scales by 1 + weight
                param.uniform_(low, high)
        model.get_output_embeddings().weight.mul_(4.0)  # logits further from ties
    model.save_pretrained(folder)
    if name == "gemma3":
        _gemma3_flat_rope(folder / "config.json")
    make_tokenizer(folder)  # the builder saves the tokenizer beside the model; not stored


# onnxruntime-genai 0.18's builder reads Gemma3's rope as transformers 4 wrote it: config.rope_parameters["rope_type"]
# (transformers 5 nests rope_parameters per layer type: KeyError 'rope_type') and config.rope_local_base_freq
# (gone in transformers 5: AttributeError). The config gets the flat keys beside the nested ones (which
# transformers keeps) and the builder runs with rope_local_base_freq read from the nested sliding_attention
# theta: the same numbers, no change to the model.
GEMMA3_SHIM = (
    "import runpy, sys, transformers; "
    "transformers.Gemma3TextConfig.rope_local_base_freq = property("
    "lambda self: self.rope_parameters['sliding_attention']['rope_theta']); "
    "sys.argv = ['builder'] + sys.argv[1:]; "
    "runpy.run_module('onnxruntime_genai.models.builder', run_name='__main__')"
)


def _gemma3_flat_rope(path: Path) -> None:
    config = json.loads(path.read_text())
    full = config["rope_parameters"]["full_attention"]
    config["rope_parameters"].update(rope_type=full["rope_type"], rope_theta=full["rope_theta"])
    path.write_text(json.dumps(config, indent=2))


def build(hf: Path, out: Path, precision: str, extra: dict[str, str]) -> str | None:
    """Runs the builder; returns None, or its error's last line."""
    gemma3 = json.loads((hf / "config.json").read_text())["architectures"] == ["Gemma3ForCausalLM"]
    entry = ["-c", GEMMA3_SHIM] if gemma3 else ["-m", "onnxruntime_genai.models.builder"]
    cmd = [sys.executable, *entry, "-i", str(hf), "-o", str(out), "-p", precision,
           "-e", "cpu", "-c", str(hf.parent / "cache")]
    if extra:
        cmd += ["--extra_options", *[f"{k}={v}" for k, v in extra.items()]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return "builder: " + (lines[-1] if lines else f"exit {done.returncode}")
    return None


def fixture(name: str, precision: str, extra: dict[str, str], work: Path) -> str | None:
    """One folder under ARCH_ROOT; returns None, or why there is none."""
    hf = work / f"hf_{name}"
    if not hf.exists():
        make_hf(name, hf)
    out = ARCH_ROOT / f"{name}_{precision}"
    shutil.rmtree(out, ignore_errors=True)
    error = build(hf, out, precision, extra)
    if error is None and name == "qwen2_pad_oov":  # a value to fill with, never an index to gather
        config = json.loads((out / "genai_config.json").read_text())
        config["model"]["pad_token_id"] = VOCAB
        (out / "genai_config.json").write_text(json.dumps(config, indent=4))
    if error is None:
        for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            (out / f).unlink(missing_ok=True)
        try:
            singles = genai_generate(out, PROMPTS, MAX_LENGTH)
        except Exception as e:  # noqa: BLE001 - recorded, the folder dropped
            error = f"onnxruntime-genai: {type(e).__name__}: {str(e).splitlines()[0]}"
        batch, batch_error = None, None
        try:
            # a padded batch gathers the pad id (outside qwen2_pad_oov's vocabulary); the ring cache refuses
            # right padding (seqlens_k below the prompt's width): recorded, the single prompts kept
            batch = genai_generate_batch(out, PROMPTS, MAX_LENGTH) if error is None else None
        except Exception as e:  # noqa: BLE001
            batch_error = f"onnxruntime-genai: {type(e).__name__}: {str(e).splitlines()[0]}"
        batch_source = "this folder"
        if batch_error and "sliding_window" in json.loads((out / "genai_config.json").read_text())["model"]["decoder"]:
            # the same weights with full-length caches (windowed_kv_cache=false) give the ring's tokens exactly
            # (the single prompts agree): their batch is the ring's reference
            full = work / f"{name}_{precision}_full_cache"
            shutil.rmtree(full, ignore_errors=True)
            if build(hf, full, precision, {**extra, "windowed_kv_cache": "false"}) is None:
                if genai_generate(full, PROMPTS, MAX_LENGTH) == singles:
                    batch = genai_generate_batch(full, PROMPTS, MAX_LENGTH)
                    batch_source = f"the windowed_kv_cache=false build of the same weights (this folder: {batch_error})"
    if error is not None:
        shutil.rmtree(out, ignore_errors=True)
        return error
    config = json.loads((out / "genai_config.json").read_text())
    hf_config = json.loads((hf / "config.json").read_text())
    write_json(out / "expected_tokens.json", {
        "source": "onnxruntime-genai greedy (do_sample=False), one prompt per generator",
        "prompts": PROMPTS,
        "max_length": MAX_LENGTH,
        "tokens": singles,
        "batch_right_padded": (
            {"pad_token_id": config["model"]["pad_token_id"], "tokens": batch, "source": batch_source}
            if batch is not None
            else {"error": batch_error}
        ),
        "hf": {"architecture": hf_config["architectures"][0], "seed": SEEDS[name], "config": hf_config},
        "builder": {"precision": precision, "execution_provider": "cpu", "extra_options": extra},
        "versions": versions(),
    })
    if name == "phi3_longrope":
        # LongRoPE switches to its long factors once the sequence passes original_max_position_embeddings (32):
        # a run past it
        stored = json.loads((out / "expected_tokens.json").read_text())
        stored["long_run"] = {"prompt": PROMPTS[0], "max_length": 48, "tokens": genai_generate(out, PROMPTS[:1], 48)[0]}
        write_json(out / "expected_tokens.json", stored)
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="architecture names to (re)make")
    args = parser.parse_args()
    names = args.only or list(_configs())
    ARCH_ROOT.mkdir(parents=True, exist_ok=True)
    results: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for precision, extra in PRECISIONS:
                if precision not in TRIED and name != "llama":
                    continue
                print(f"-- {name}_{precision}", flush=True)
                error = fixture(name, precision, extra, Path(tmp))
                results[f"{name}_{precision}"] = error or "ok"
                print("   ", error or "ok", flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
