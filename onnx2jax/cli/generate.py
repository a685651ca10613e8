"""``onnx2jax generate``: generate tokens from a decoder LLM (an onnxruntime-genai folder, a torch export with a
cache), printing each token as it is made (one decode step per call, its text flushed before the next step
runs), then its figures from the command's start: the load, the time to first token (load included), the decode
program's compile and the decode rate over the decode time only (docs/generation.md).

Examples::

    onnx2jax generate data:llama_gqa --prompt-ids 1,17,230 --max-new-tokens 8
    onnx2jax generate data:llama_gqa --prompt "the small" --sample --top-p 0.9 --seed 3
    onnx2jax generate FOLDER --prompt-ids 1,2,3 --devices 2    # a model folder of yours, tensor-parallel

data:NAME is a model that ships with onnx2jax (onnx2jax data lists them).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time

import numpy as np

from onnx2jax.cli.errors import CliError, UsageError, install_hint
from onnx2jax.cli.options import add_cache_arguments, ensure_devices, synchronous_cpu_dispatch
from onnx2jax.runtime import compilation_cache
from onnx2jax.runtime.compilation_cache import Lookups

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
    parser.add_argument("--sample", action=argparse.BooleanOptionalAction, default=None,
                        help="sample (--sample) or take the most likely token (--no-sample); default genai_config's "
                        "do_sample, else greedy")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default genai_config's, or 1)")
    parser.add_argument("--top-k", type=int, help="sample among the k most likely tokens (default genai_config's; "
                        "0: all)")
    parser.add_argument("--top-p", type=float, help="sample among the most likely tokens of total probability p "
                        "(default genai_config's, or 1)")
    parser.add_argument("--repetition-penalty", type=float, metavar="P", help="transformers' repetition penalty, "
                        "greedy or sampled (default genai_config's, or 1: none)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (default genai_config's random_seed "
                        "where >= 0, else 0)")
    parser.add_argument("--eos", type=int, action="append", metavar="ID", help="eos token id (repeatable; "
                        "default genai_config's)")
    parser.add_argument("--check", action="store_true",
                        help="compare the greedy tokens with onnxruntime-genai's (needs onnxruntime-genai)")
    add_cache_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Generates from one prompt, streaming the tokens; exit 1 where --check finds a difference."""
    start = time.perf_counter()  # the figures count from here: loading is part of the first token's wait
    folder = args.model if os.path.isdir(args.model) else os.path.dirname(os.path.abspath(args.model))
    _check_search(args)
    tokenizer = _tokenizer(folder) if args.prompt is not None else None
    if args.check:
        _require_genai()
        if not os.path.isfile(os.path.join(folder, "genai_config.json")):
            raise CliError(f"--check runs onnxruntime-genai, which needs a genai_config.json in {folder}")
    ids = tokenizer.encode(args.prompt).ids if tokenizer else _parse_ids(args.prompt_ids)
    synchronous_cpu_dispatch()  # a token to the host per step: nothing to overlap
    if args.devices:
        ensure_devices(args.devices)
    from onnx2jax.runtime.generate import Generator
    from onnx2jax.runtime.load import load
    from onnx2jax.serving.text import IncrementalText

    model = load(args.model, devices=args.devices or None)
    loaded = time.perf_counter() - start
    generator = Generator(
        model, [ids], max_length=args.max_length, max_new_tokens=args.max_new_tokens, do_sample=args.sample,
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        repetition_penalty=args.repetition_penalty, seed=args.seed, eos_token_id=args.eos,
    )
    if model.placement.note:
        print(f"note: {model.placement.note}")
    out = sys.stdout
    out.write(tokenizer.decode(ids) if tokenizer else " ".join(map(str, ids)))
    out.write(" |" if not tokenizer else "")
    out.flush()
    text = IncrementalText(tokenizer, ids) if tokenizer else None
    timing = Timing(loaded)
    with compilation_cache.watch() as lookups:
        for token in generator:  # one step per call: each token printed before the next step runs
            timing.token(time.perf_counter() - start)
            out.write(text.add(int(token[0])) if text else f" {int(token[0])}")
            out.flush()
            if timing.count == 1:  # the decode program's compile, timed apart from the decode
                prefill = dataclasses.replace(lookups)
                generator.compile_decode()
                timing.decoding(time.perf_counter() - start, prefill, lookups)
        if text:
            out.write(text.flush())
    out.write("\n")
    print(timing.line(lookups))
    if args.check:
        return _check(generator, ids, args)
    return 0


@dataclasses.dataclass
class Timing:
    """The run's figures, in seconds from the command's start: the load, the first token (the load, the
    prefill's compile and the prefill), the decode program's compile (timed apart, after the first token:
    ``Generator.compile_decode``), and the decode: the tokens after the first over the time from the compiled
    decode program to the last token, so that the rate is the same whatever the number of tokens."""

    loaded: float
    count: int = 0
    first: float = 0.0
    last: float = 0.0
    decode_from: float | None = None
    prefill: Lookups = dataclasses.field(default_factory=Lookups)
    decode: Lookups = dataclasses.field(default_factory=Lookups)

    def token(self, at: float) -> None:
        """A new token came at ``at``."""
        self.count += 1
        self.first = at if self.count == 1 else self.first
        self.last = at

    def decoding(self, at: float, prefill: Lookups, lookups: Lookups) -> None:
        """The decode program is ready at ``at``; ``prefill``: the cache lookups up to the first token,
        ``lookups``: those up to now."""
        self.decode_from, self.prefill = at, prefill
        self.decode = Lookups(lookups.hits - prefill.hits, lookups.misses - prefill.misses)

    def line(self, lookups: Lookups) -> str:
        """The figures line (``lookups``: the persistent cache's, where there was no decode)."""
        line = f"load {self.loaded:.3f}s"
        if not self.count:
            return line + "; no new tokens (the prompt fills max_length, or the first token was eos)"
        prefill = self.prefill if self.decode_from is not None else lookups
        line += (f"; time to first token {self.first:.3f}s from the start (load included; prefill "
                 f"{self.first - self.loaded:.3f}s, {prefill.describe()} included); {self.count} new tokens")
        if self.count > 1 and self.decode_from is not None:
            decode = self.last - self.decode_from
            line += (f"; decode program {self.decode_from - self.first:.3f}s ({self.decode.describe()}); decode "
                     f"{self.count - 1} tokens in {decode * 1e3:.2f} ms: {(self.count - 1) / decode:.1f} tokens/s")
        return line


def _check_search(args: argparse.Namespace) -> None:
    """Refuses, before anything loads, genai_config.json's unimplemented search options (by name:
    ``num_beams`` > 1, ...), sampling flags on a greedy run (nothing is ignored) and --check on a sampled one."""
    from onnx2jax.runtime.search_options import folder_defaults

    defaults = folder_defaults(args.model) if os.path.isdir(args.model) else None
    sample = args.sample if args.sample is not None else bool(defaults and defaults.do_sample)
    why = "without --sample" if defaults is None or args.sample is not None else "genai_config.json's do_sample is false"
    flags = [f for f, v in (("--temperature", args.temperature), ("--top-k", args.top_k), ("--top-p", args.top_p),
                            ("--seed", args.seed)) if v is not None]
    if flags and not sample:
        raise UsageError(f"{', '.join(flags)}: for sampling, and this run is greedy ({why}): add --sample")
    if args.check and sample:
        raise UsageError("--check compares greedy tokens: leave out --sample" if args.sample else
                         "--check compares greedy tokens, and genai_config.json's do_sample is true: give --no-sample")


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
        raise CliError(f"--prompt needs the tokenizers package: {install_hint('text', 'tokenizers')}") from e
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
    params.set_search_options(max_length=generator.max_length, do_sample=False,
                              repetition_penalty=generator.search.repetition_penalty)
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
