"""``onnx2jax demo``: the one command a new user runs first.

The tiny Llama fixture (a torch dynamo export: RoPE, grouped-query attention,
RMSNorm, SiLU-gated MLP) is annotated with the Megatron tensor-parallel plan
for 8 devices, compiled on 8 (fake CPU) devices, and checked against the
unsharded run of the same model. It prints the per-node specs, the
collectives of the compiled program, the parameter bytes per device, and the
max |diff|.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time

import numpy as np
import onnx

import onnx2jax  # lazy: its names import jax on first use
from onnx2jax.cli.annotate import require_annotations
from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError
from onnx2jax.bundled import demo_model_path
from onnx2jax.cli import summary
from onnx2jax.cli.options import add_cache_arguments, add_verbose_argument, ensure_devices
from sharding.megatron import megatron_layout, megatron_plan

DEVICES = 8
TOLERANCE = 1e-4


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``demo`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser("demo", help="tiny Llama, tensor parallel on 8 devices, checked against the unsharded run")
    parser.add_argument("--model", default=None, help="an ONNX transformer (default: the bundled tiny Llama)")
    parser.add_argument("--devices", type=int, default=DEVICES, metavar="N",
                        help="tensor-parallel degree (default 8; must divide the heads and the vocabulary)")
    add_verbose_argument(parser, "the sharding report's tables (every spec written, its PartitionSpec, the notes)")
    add_cache_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs the demo on ``--model`` (default: the bundled tiny Llama) over ``--devices``."""
    if args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    return run_demo(terminal.make_console(), args.model, args.devices, verbose=args.verbose)


def default_model() -> pathlib.Path:
    """The tiny Llama that ships as package data (:func:`onnx2jax.demo_model_path`), so a wheel has it too."""
    return demo_model_path()


def run_demo(console, model_path: str | os.PathLike | None = None, devices: int = DEVICES, *,
             verbose: bool = False) -> int:
    """Runs the demo; returns the process exit code (1 if the sharded run differs)."""
    ensure_devices(devices)
    import jax  # the demo runs a model; importing this module (onnx2jax --help) must not start jax

    path = pathlib.Path(model_path) if model_path else default_model()
    if not path.is_file():
        raise CliError(f"model {path} not found; pass --model PATH")
    model = onnx.load(str(path))
    console.print(f"[bold]{path.name}[/bold]: {len(model.graph.node)} nodes; Megatron plan for {devices} devices")
    annotated = megatron_plan(model, devices)
    require_annotations(annotated, "megatron", devices, list(megatron_layout(model, devices).notes))
    rng = np.random.default_rng(0)
    input_ids = rng.integers(0, 256, (2, 16)).astype(np.int64)

    with console.status("compiling the sharded program ..."):
        start = time.perf_counter()
        compiled = onnx2jax.compile(annotated)
        (sharded,) = compiled(input_ids)
        jax.block_until_ready(sharded)
        seconds = time.perf_counter() - start
    with console.status("running the unsharded model ..."):
        (reference,) = onnx2jax.translate(model)(input_ids)
    report = compiled.report()
    if verbose:
        report.render(console)
    else:
        for line in summary.headline(report):
            console.print(line, markup=False)
    diff = float(np.max(np.abs(np.asarray(sharded) - np.asarray(reference))))
    console.print(f"compiled and ran in {seconds:.1f}s on {len(compiled.mesh.devices.flat)} devices {dict(compiled.mesh.shape)}")
    verdict = "[green]OK[/green]" if diff <= TOLERANCE else "[red]MISMATCH[/red]"
    console.print(f"logits {tuple(sharded.shape)}: max |sharded - unsharded| = {diff:.3g} {verdict}")
    return 0 if diff <= TOLERANCE else 1
