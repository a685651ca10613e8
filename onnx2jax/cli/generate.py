"""``onnx2jax generate``: generate tokens from a decoder LLM (an onnxruntime-genai folder, a torch export with a
cache), printing them as they come, then its figures from the command's start: the load, the time to first
token (load included) and the decode rate over the decode time only (docs/generation.md).

Examples::

    onnx2jax generate tests/data/genai/llama_gqa --prompt-ids 1,17,230 --max-new-tokens 8
    onnx2jax generate FOLDER --prompt "once upon a time" --sample --top-p 0.9 --seed 3
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

from onnx2jax.cli.errors import CliError, UsageError
from onnx2jax.cli.options import add_cache_arguments, ensure_devices
from onnx2jax.runtime import compilation_cache

TOKENIZER = "tokenizer.json"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``generate`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser("generate", help="generate tokens from a decoder LLM with a KV cache",
                            description=__doc__)
    parser.add_argument("model", help="an onnxruntime-genai folder (genai_config.json), or an .onnx decoder")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt-ids", metavar="ID,ID,...",
                        help="the prompt as token ids, separated by commas, spaces or both")
    prompt.add_argument("--prompt", metavar="TEXT",
                        help="the prompt as text (needs tokenizer.json beside the model and the 'text' extra)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="new tokens at most (default: up to "
                        "max_length)")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="tokens at most, prompt included (default genai_config's search.max_length)")
    parser.add_argument("--devices", type=int, default=0, metavar="N", help="tensor-parallel over N devices")
    parser.add_argument("--sample", action="store_true", help="sample instead of greedy")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default genai_config's, or 1)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float, help="sample among the most likely tokens of total probability p")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--eos", type=int, action="append", metavar="ID", help="eos token id (repeatable; "
                        "default genai_config's)")
    parser.add_argument("--check", action="store_true",
                        help="compare the greedy tokens with onnxruntime-genai's (needs onnxruntime-genai)")
    add_cache_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Generates from one prompt, streaming the tokens; exit 1 where --check finds a difference."""
    start = time.perf_counter()  # the figures count from here: loading is part of the first token's wait
    if args.check and args.sample:
        raise UsageError("--check compares greedy tokens; leave out --sample")
    folder = args.model if os.path.isdir(args.model) else os.path.dirname(os.path.abspath(args.model))
    tokenizer = _tokenizer(folder) if args.prompt is not None else None
    if args.check:
        _require_genai()
        if not os.path.isfile(os.path.join(folder, "genai_config.json")):
            raise CliError(f"--check runs onnxruntime-genai, which needs a genai_config.json in {folder}")
    ids = tokenizer.encode(args.prompt).ids if tokenizer else _parse_ids(args.prompt_ids)
    if args.devices:
        ensure_devices(args.devices)
    from onnx2jax.runtime.generate import Generator
    from onnx2jax.runtime.load import load

    model = load(args.model, devices=args.devices or None)
    loaded = time.perf_counter() - start
    generator = Generator(
        model, [ids], max_length=args.max_length, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed, eos_token_id=args.eos,
    )
    if model.placement.note:
        print(f"note: {model.placement.note}")
    out = sys.stdout
    out.write(tokenizer.decode(ids) if tokenizer else " ".join(map(str, ids)))
    out.write(" |" if not tokenizer else "")
    out.flush()
    times: list[float] = []  # when each new token came, from the command's start
    new: list[int] = []
    shown = ""
    with compilation_cache.watch() as lookups:
        for token in generator:
            times.append(time.perf_counter() - start)
            new.append(int(token[0]))
            if tokenizer:
                text = tokenizer.decode(ids + new)[len(tokenizer.decode(ids)):]
                out.write(text[len(shown):])
                shown = text
            else:
                out.write(f" {new[-1]}")
            out.flush()
    out.write("\n")
    print(_figures(loaded, times, lookups.describe()))
    if args.check:
        return _check(generator, ids, args)
    return 0


def _figures(loaded: float, times: list[float], compiled: str) -> str:
    """The load time, the time to first token from the command's start (the load, the prefill's compile and the
    prefill), and the decode rate: the tokens after the first over the time from the first to the last (the
    decode program's compile, or its load from the persistent cache, included). ``compiled``: how the
    programs were obtained (``compilation_cache.Lookups.describe``)."""
    line = f"load {loaded:.3f}s"
    if not times:
        return line + "; no new tokens (the prompt fills max_length, or the first token was eos)"
    line += (f"; time to first token {times[0]:.3f}s from the start (load included; prefill "
             f"{times[0] - loaded:.3f}s, {compiled} included); {len(times)} new tokens")
    if len(times) > 1:
        decode = times[-1] - times[0]
        line += f"; decode {len(times) - 1} tokens in {decode:.3f}s: {(len(times) - 1) / decode:.1f} tokens/s"
    return line


def _parse_ids(text: str) -> list[int]:
    """The prompt's ids: integers separated by commas, spaces or both (``"1,17,230"``, ``"1 17 230"``,
    ``"1, 17, 230"``); anything else (``"1.5"``, ``"a"``, ``"1,,2"``) is refused by name. Range is checked
    against the vocabulary later, as every prompt is."""
    parts = [p for p in re.split(r"\s*,\s*|\s+", text.strip())] if text.strip() else []
    bad = [p for p in parts if not re.fullmatch(r"[+-]?\d+", p)]
    if bad:
        raise UsageError(
            f"--prompt-ids takes integers separated by commas or spaces, got {bad[0]!r} in {text!r}"
        )
    if not parts:
        raise UsageError("--prompt-ids is empty")
    return [int(p) for p in parts]


def _tokenizer(folder: str):
    """The folder's tokenizer.json read by the ``tokenizers`` package (the ``text`` extra)."""
    path = os.path.join(folder, TOKENIZER)
    if not os.path.isfile(path):
        raise CliError(f"--prompt needs {TOKENIZER} in {folder}; give --prompt-ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError as e:
        raise CliError("--prompt needs the tokenizers package: pip install 'onnx2jax[text]'") from e
    return Tokenizer.from_file(path)


def _require_genai() -> None:
    try:
        import onnxruntime_genai  # noqa: F401 - only tried here
    except ImportError as e:
        raise CliError(
            "--check needs onnxruntime-genai, which is not installed (pip install onnxruntime-genai; it is a "
            "benchmark-only dependency, not installed in CI)"
        ) from e


def _check(generator, ids: list[int], args: argparse.Namespace) -> int:
    """Runs onnxruntime-genai greedily on the same prompt and length; 0 where the tokens are the same."""
    import onnxruntime_genai as og

    folder = args.model if os.path.isdir(args.model) else os.path.dirname(os.path.abspath(args.model))
    model = og.Model(folder)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=generator.max_length, do_sample=False)
    reference = og.Generator(model, params)
    reference.append_tokens(np.array([ids], np.int32))
    while not reference.is_done():
        reference.generate_next_token()
    want = [int(t) for t in reference.get_sequence(0)]
    got = generator.sequences[0].tolist()
    if got == want:
        print(f"check: the same {len(got)} tokens as onnxruntime-genai")
        return 0
    where = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    print(f"check: differs from onnxruntime-genai at position {where}: onnxruntime-genai gives {want}")
    return 1
