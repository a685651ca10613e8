"""``onnx2jax serve``: serve a decoder LLM over HTTP with OpenAI's API, many users at once (continuous batching
over a paged KV cache; see docs/serving.md).

Examples::

    onnx2jax serve data:llama_gqa --port 8000 --max-batch 8
    curl localhost:8000/v1/completions -d '{"model": "llama_gqa", "prompt": "the small", "max_tokens": 8}'
    onnx2jax serve FOLDER --devices 2    # a model folder of yours, tensor-parallel

data:NAME is a model that ships with onnx2jax (onnx2jax data lists them). SIGTERM or Ctrl-C stops taking
requests, lets those in flight finish (up to --shutdown-timeout seconds, then aborts them) and exits 0.
Needs the 'serve' extra: starlette, uvicorn, tokenizers, jinja2 (in a clone of onnx2jax:
pip install -e '.[serve]').
"""

from __future__ import annotations

import argparse
import os
import sys

from onnx2jax.cli.errors import CliError, install_hint
from onnx2jax.cli.options import (CPU_THREADS_ENV, ensure_devices, limit_cpu_threads, serve_cpu_threads,
                                  synchronous_cpu_dispatch)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``serve`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser("serve", help="serve a decoder LLM with OpenAI's HTTP API", description=__doc__)
    parser.add_argument("model", help="a model folder: onnxruntime-genai's (genai_config.json) or a torch "
                        "export's model.onnx, with tokenizer.json")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: a free port the OS "
                        "chooses, said in the start-up line)")
    parser.add_argument("--max-batch", type=int, default=8, metavar="B", help="requests decoding at once (slots; "
                        "default 8); more wait in the queue")
    parser.add_argument("--max-tokens-in-cache", type=int, default=None, metavar="N",
                        help="KV cache positions over all requests (default max-batch x the context)")
    parser.add_argument("--page-size", type=int, default=16, help="cache positions per page (default 16)")
    parser.add_argument("--prefill-chunk", type=int, default=32, help="prompt tokens prefilled per step, a "
                        "multiple of --page-size (default 32)")
    parser.add_argument("--prefill-rows", type=int, default=4, help="newcomers prefilled together in one step, a "
                        "chunk each (default 4)")
    parser.add_argument("--queue-bound", type=int, default=64, help="requests waiting at most; beyond, HTTP 429 "
                        "(default 64)")
    parser.add_argument("--context-length", type=int, default=None,
                        help="the model's context (default genai_config.json's; needed without one)")
    parser.add_argument("--served-model-name", default=None, help="the model's name in the API (default the "
                        "folder's name)")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="S",
                        help="on SIGTERM, seconds the requests in flight may take to finish (default 30)")
    parser.add_argument("--devices", type=int, default=0, metavar="N", help="tensor-parallel over N devices, the "
                        "cache pages split by KV heads (on CPU: N fake devices)")
    parser.add_argument("--cpu-threads", type=int, default=None, metavar="T",
                        help="XLA's intra-op threads on CPU (default: 1 for a one-device model whose weights are "
                        "under 32 MiB, where handing a step's pieces to other threads costs more than it saves; "
                        "else one per core)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Loads the model, compiles its programs and serves until SIGTERM / SIGINT; exit 0 then."""
    if not os.path.exists(args.model):
        raise CliError(f"{args.model}: no such folder")
    if not os.path.isdir(args.model):
        raise CliError(f"{args.model}: serve takes a model folder (with tokenizer.json), not a file")
    if args.cpu_threads is not None and args.cpu_threads < 1:
        raise CliError(f"--cpu-threads must be at least 1, got {args.cpu_threads}")
    try:
        from onnx2jax.serving.server import bind, build_app, serve
        from onnx2jax.serving.text import Text
    except ImportError as error:
        hint = install_hint("serve", "starlette uvicorn tokenizers jinja2")
        raise CliError(f"onnx2jax serve needs the 'serve' extra ({hint}): {error}") from error
    from onnx2jax.runtime.search_options import folder_defaults
    from onnx2jax.serving.driver import EngineDriver

    defaults = folder_defaults(args.model)  # before loading: num_beams > 1 and the like are refused by name
    text = Text(args.model)
    # The process's settings, after every refusal (a refused command changes nothing) and before JAX starts
    # (both are read once, then). Every step reads its tokens back before the next one runs, so XLA's
    # asynchronous CPU dispatch overlaps nothing: it only hands each execution to a worker thread and back. The
    # engine's thread releases the GIL while XLA runs either way, so the HTTP side is not starved.
    threads = serve_cpu_threads(args.model, args.cpu_threads, args.devices or 1)
    if threads is not None:
        limit_cpu_threads(threads, chosen=args.cpu_threads is not None)
    synchronous_cpu_dispatch()
    if args.devices and args.devices > 1:
        ensure_devices(args.devices)
    name = args.served_model_name or os.path.basename(os.path.normpath(args.model))
    engine = _engine(args)
    engine.warmup()
    driver = EngineDriver(engine, queue_bound=args.queue_bound)
    app = build_app(driver, text, name, aliases=(args.model,), shutdown_timeout=args.shutdown_timeout,
                    defaults=defaults)
    try:
        sock = bind(args.host, args.port)
    except OSError as error:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {error.strerror or error}") from error
    port = sock.getsockname()[1]
    counts = engine.counts
    where = f", {engine.source.devices} devices" if engine.source.devices > 1 else ""
    if os.environ.get(CPU_THREADS_ENV):
        where += f", XLA CPU threads {os.environ[CPU_THREADS_ENV]}"
    print(f"onnx2jax serve: {name} on http://{args.host}:{port}/v1 ({args.max_batch} slots, {counts['pages']} "
          f"cache pages of {args.page_size}, context {engine.context_length}{where})", file=sys.stderr, flush=True)
    if engine.source.note:
        print(f"note: {engine.source.note}", file=sys.stderr, flush=True)
    if defaults is not None:
        print(f"note: a request's sampling parameters default to genai_config.json's: {_describe(defaults)}",
              file=sys.stderr, flush=True)
    serve(app, sock, shutdown_timeout=args.shutdown_timeout)
    print("onnx2jax serve: stopped", file=sys.stderr, flush=True)
    return 0


def _describe(defaults) -> str:
    """The folder's search defaults in a few words (``temperature`` 0 is how a request asks for greedy)."""
    if defaults.do_sample:
        words = [f"sampled (temperature {defaults.temperature:g}, top_k {defaults.top_k}, top_p {defaults.top_p:g})"]
    else:
        words = ["greedy (do_sample false: temperature 0)"]
    if defaults.repetition_penalty != 1:
        words.append(f"repetition_penalty {defaults.repetition_penalty:g}")
    if defaults.seed is not None:
        words.append(f"seed {defaults.seed}")
    return ", ".join(words)


def _engine(args: argparse.Namespace):
    from onnx2jax.serving import Engine
    from onnx2jax.serving.source import open_model

    source = open_model(args.model, devices=args.devices or None)
    context = args.context_length or source.context_length
    if context is None:
        raise CliError(f"{args.model}: the model's context length is unknown (no genai_config.json): give "
                       "--context-length")
    cache = args.max_tokens_in_cache or args.max_batch * context
    return Engine(source, max_batch=args.max_batch, max_tokens_in_cache=cache, page_size=args.page_size,
                  prefill_chunk=args.prefill_chunk, prefill_rows=args.prefill_rows, context_length=context)
