"""``onnx2jax run``: run a model on random or given inputs, optionally sharded and checked against onnxruntime."""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

import onnx2jax  # lazy: its names import jax on first use
from onnx2jax.benchmark import max_abs_diff
from onnx2jax.cli import console as terminal  # terminal.make_console at call time: tests swap it
from onnx2jax.cli.errors import CliError, UsageError
from onnx2jax.cli.errors import describe as describe_error
from onnx2jax.errors import ConfigurationError
from onnx2jax.cli.inputs import (
    conform, defaulted_dims_hint, parse_dims, random_inputs, read_input_files, symbolic_dims,
)
from onnx2jax.cli import summary
from onnx2jax.cli.options import (
    add_cache_arguments, add_scan_argument, add_verbose_argument, ensure_devices, scan_setting,
)
from onnx2jax.runtime import compilation_cache
from sharding.model_arg import as_model_proto
from sharding.segments import describe
from sharding.model_configs import device_configurations


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``run`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser("run", help="run a model on random or given inputs")
    parser.add_argument("model", help="the .onnx file")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an input from a .npy (or one-array .npz) file, or FILE.npz holding arrays named "
                             "after the inputs (repeatable; the rest are random)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT",
                        help="size of a symbolic dim of the random inputs (default 2, said when used)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--output", metavar="OUT.npz", help="save the outputs, by output name")
    parser.add_argument("--check", action="store_true",
                        help="compare with onnxruntime (exit 1 if it differs or cannot run the model)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max |diff| allowed by --check (default 1e-4)")
    parser.add_argument("--devices", type=int, default=None, metavar="N",
                        help="run sharded from the model's annotations, with N devices visible (N >= the "
                             "configuration's devices; the configuration's count is used and said)")
    parser.add_argument("--configuration", metavar="NAME", default=None,
                        help="with --devices: the device configuration to run, for a model that defines several")
    parser.add_argument("--microbatches", type=int, default=1, metavar="M",
                        help="with --devices, for a model with pipeline stages: split each call's batch into M "
                             "micro-batches run fill-drain through the stages (default 1)")
    parser.add_argument("--no-check-indices", dest="check_indices", action="store_false",
                        help="skip the host check that integer inputs indexing a table (token ids, Gather "
                             "indices) are in range (XLA would answer with clamped or NaN rows)")
    add_scan_argument(parser)
    add_verbose_argument(parser, "the sharding report's tables (every spec, where it went, the notes) and the "
                                 "layers' form")
    add_cache_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Runs a model on given or random inputs; optionally saves the outputs and compares with onnxruntime."""
    _check_output_path(args.output)
    if args.devices is not None and args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices} (leave it out to run unsharded)")
    if args.microbatches != 1 and not args.devices:
        raise UsageError("--microbatches splits the batch of a model with pipeline stages; it goes with --devices N")
    if args.devices:
        ensure_devices(args.devices)
    console = terminal.make_console()
    if args.devices:
        used = _check_annotated(args.model, args.devices, args.configuration)
        if used < args.devices:
            console.print(f"note: the model's configuration has {used} devices: running on {used} of the "
                          f"{args.devices} asked for", markup=False)
        runner = onnx2jax.compile(
            args.model, microbatches=args.microbatches, scan_layers=scan_setting(args.scan_layers),
            check_indices=args.check_indices, configuration=args.configuration,
        )
        model = runner.model
    else:
        runner = model = onnx2jax.translate(
            args.model, scan_layers=scan_setting(args.scan_layers), check_indices=args.check_indices
        )
        if model.segments:
            listed = ":" if args.verbose else "; --verbose lists them"
            count = len(model.segments)
            console.print(f"runs in {count} segments (data-dependent output shapes){listed}", markup=False)
            for line in describe(model.segments) if args.verbose else ():
                console.print(f"  {line}", markup=False)
    dims = parse_dims(args.dim, symbolic_dims(model))
    given = conform(read_input_files(args.input, model.input_names), model)
    drawn = random_inputs(model, args.seed, dims, skip=list(given.values))
    inputs = {**drawn.values, **given.values}
    for note in drawn.notes + given.notes:
        console.print(f"note: {note}", markup=False)
    with console.status(f"tracing and compiling {args.model} ..."), compilation_cache.watch() as lookups:
        try:
            first, outputs, steady, calls = _timed_calls(runner, inputs)
        except Exception as e:  # noqa: BLE001 - re-raised; a run on sizes nobody gave says which to give
            if not drawn.defaulted:
                raise
            raise CliError(f"{describe_error(e)}; {defaulted_dims_hint(drawn.defaulted)}") from e
    console.print(
        f"first call {first:.2f}s (trace + {lookups.describe()} + run), "
        f"then {_ms(steady)} per call (mean of {calls} calls back to back)"
    )
    _print_report(console, runner if args.devices else None, model, inputs, args.verbose)
    if args.output:
        np.savez(args.output, **dict(zip(model.output_names, outputs, strict=True)))
    reference, why_not = _onnxruntime_outputs(args.model, inputs) if args.check else (None, None)
    worst, nonfinite = 0.0, []
    for index, (name, out) in enumerate(zip(model.output_names, outputs)):
        line = f"{name}: shape {out.shape} dtype {out.dtype}"
        if reference is not None:
            ours, theirs = _comparable(out), _comparable(reference[index])
            diff = max_abs_diff(ours, theirs)
            worst = max(worst, diff)
            line += f"  max |diff| vs onnxruntime {diff:.3g}"
            nonfinite += _nonfinite_where_finite(name, ours, theirs)
        console.print(line, markup=False)
    if args.output:
        console.print(f"wrote {args.output}: {', '.join(model.output_names)}", markup=False)
    # A failed check is an error (stderr, exit 1); the outputs above are printed all the same.
    if why_not is not None:
        raise CliError(f"not checked: onnxruntime cannot run this model: {why_not}")
    if nonfinite:
        raise CliError("; ".join(nonfinite))
    if reference is not None and worst > args.tolerance:
        raise CliError(f"max |diff| {worst:.3g} exceeds tolerance {args.tolerance:g} (--tolerance)")
    return 0


def _print_report(console, compiled, model, inputs: dict[str, np.ndarray], verbose: bool) -> None:
    """The headline figures of a sharded run; with ``verbose``, the report's tables and the layers line, once."""
    report = compiled.report(**inputs) if compiled is not None else None
    if report is not None and not verbose:
        for line in summary.headline(report):
            console.print(line, markup=False)
    if not verbose:
        return
    if report is not None:
        report.render(console)
    said = {f"{n}".strip() for n in getattr(report, "notes", ())}
    for line in summary.once(summary.merged_stage_lines(model.layers_report()), said):
        console.print(line, markup=False)


def _check_output_path(path: str | None) -> None:
    """Fails before any compile when ``--output`` cannot be written."""
    if path is None:
        return
    if not path.endswith(".npz"):
        raise UsageError(f"--output writes a .npz file; got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--output {path}: folder {folder} does not exist")


def _check_annotated(path: str, devices: int, asked: str | None = None) -> int:
    """``--devices N`` needs a model with a device configuration of at most N devices; returns its count.

    Raises:
      ConfigurationError: the model defines several configurations and ``--configuration`` names none
        of them (as ``onnx2jax.compile`` would, before any work).
    """
    configurations = device_configurations(as_model_proto(path))  # external weights stay on disk
    if not configurations:
        raise CliError(
            f"{path} has no sharding annotations, so --devices {devices} has nothing to shard; "
            f"annotate it first (onnx2jax annotate {path} --plan megatron --devices {devices} -o out.onnx) "
            "or leave out --devices"
        )
    if asked is not None or len(configurations) > 1:
        if asked not in configurations:
            raise ConfigurationError(tuple(configurations), asked)
        name, config = asked, configurations[asked]
    else:
        name, config = next(iter(configurations.items()))
    if config.num_devices > devices:
        raise CliError(f"configuration {name!r} of {path} needs {config.num_devices} devices; "
                       f"pass --devices {config.num_devices}")
    return config.num_devices


def _timed_calls(runner, inputs: dict[str, np.ndarray], budget: float = 1.0, most: int = 20):
    """(seconds of the first call, its outputs as numpy, mean seconds of later calls, how many)."""
    import jax  # loads with the model run, not with the parser (onnx2jax --help)

    start = time.perf_counter()
    outputs = [np.asarray(o) for o in jax.block_until_ready(runner(**inputs))]
    first = time.perf_counter() - start
    calls, spent = 0, 0.0
    while calls < most and (calls < 2 or spent < budget):
        start = time.perf_counter()
        jax.block_until_ready(runner(**inputs))
        spent += time.perf_counter() - start
        calls += 1
    return first, outputs, spent / calls, calls


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.2f}s"


def _comparable(value) -> np.ndarray:
    """An output as a numeric array: a sequence of maps (a ZipMap's class probabilities) as rows by sorted key.

    onnxruntime returns such an output as a list of dicts, onnx2jax as an object array of them; any other
    output is the array it is.
    """
    items = list(value) if isinstance(value, (list, tuple)) or getattr(value, "dtype", None) == object else None
    if items and all(isinstance(item, dict) for item in items):
        keys = sorted(items[0])
        if any(sorted(item) != keys for item in items):
            return np.asarray([np.inf])  # different keys: never equal
        return np.array([[item[k] for k in keys] for item in items], np.float64)
    return np.asarray(value)


def _nonfinite_where_finite(name: str, out: np.ndarray, reference: np.ndarray) -> list[str]:
    """One message if ``out`` has NaN or inf where onnxruntime's ``reference`` is finite."""
    if out.shape != reference.shape or out.dtype.kind not in "fc":
        return []
    bad = ~np.isfinite(out) & np.isfinite(reference)
    if not bad.any():
        return []
    nans, infs = int(np.isnan(out[bad]).sum()), int(np.isinf(out[bad]).sum())
    return [f"{name}: {nans} NaN and {infs} inf where onnxruntime's output is finite"]


def _onnxruntime_outputs(model_path: str, inputs: dict[str, np.ndarray]) -> tuple[list[np.ndarray] | None, str | None]:
    """onnxruntime's outputs, or None and why onnxruntime could not run the model."""
    try:
        import onnxruntime as ort  # optional: only --check needs it
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise CliError("--check needs onnxruntime: pip install onnxruntime") from e
    try:
        session = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        return session.run(None, inputs), None
    except Exception as e:  # noqa: BLE001 - onnxruntime's own errors; our outputs are still shown
        return None, str(e).strip().splitlines()[0][:300]
