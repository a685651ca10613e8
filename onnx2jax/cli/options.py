"""Pieces several sub-commands share: ``--scan-layers``, ``--verbose``, ``--cache``/``--no-cache``, ``--target``/
``--slices``, sizes such as ``16GB``, and starting JAX (XLA's own log kept off stderr, devices asked for)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from onnx2jax.cli.errors import CliError, UsageError, debug_requested
from onnx2jax.errors import CacheFolderError
from onnx2jax.runtime import compilation_cache

if TYPE_CHECKING:
    from onnx2jax.runtime.targets import Target

_SCAN_CHOICES = {"auto": "auto", "on": True, "off": False}


def add_scan_argument(parser: argparse.ArgumentParser) -> None:
    """``--scan-layers auto|on|off``: run a transformer's repeated layers as one lax.scan (onnx2jax.scan)."""
    parser.add_argument(
        "--scan-layers", choices=sorted(_SCAN_CHOICES), default="auto",
        help="run the repeated layers of a transformer as one lax.scan, so compile time does not grow with "
             "depth: auto (default: from 16 repeated layers), on (or fail saying why), off (unrolled)",
    )


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``--target tpu:v5e:2x4`` and ``--slices N``: compile for a TPU topology that is not attached
    (:mod:`onnx2jax.runtime.targets`; ``onnx2jax targets`` lists them)."""
    parser.add_argument(
        "--target", metavar="TPU", default=None,
        help="also compile for this TPU topology, ahead of time on this machine, as jax spells it: "
             "tpu:v5e:2x4, tpu:v5p:2x2x2, tpu:v6e:2x4 (onnx2jax targets lists them; needs libtpu: "
             "pip install 'jax[tpu]'); no weight is read",
    )
    parser.add_argument("--slices", type=int, default=1, metavar="N",
                        help="--target: N slices of the topology, data parallel across them (default 1)")


def target_of(args: argparse.Namespace) -> "Target | None":
    """The :class:`~onnx2jax.runtime.targets.Target` ``--target``/``--slices`` name, or None.

    Raises:
      UsageError: a name that is not a topology as jax spells it, ``--slices`` below 1, or ``--slices``
        without ``--target``.
    """
    target, slices = getattr(args, "target", None), getattr(args, "slices", 1)
    if target is None:
        if slices != 1:
            raise UsageError("--slices goes with --target")
        return None
    from onnx2jax.errors import TargetError
    from onnx2jax.runtime.targets import parse_target  # imports jax: only when a target is asked for

    try:
        return parse_target(target, slices)
    except TargetError as e:
        raise UsageError(f"--target: {e.reason}") from None


def add_verbose_argument(parser: argparse.ArgumentParser, tables: str) -> None:
    """``-v/--verbose``: print ``tables`` as well as the short summary every command prints."""
    parser.add_argument("-v", "--verbose", action="store_true", help=f"also print {tables}")


def add_cache_arguments(parser: argparse.ArgumentParser) -> None:
    """``--cache DIR`` / ``--no-cache`` for a sub-command that compiles (:mod:`onnx2jax.runtime.compilation_cache`)."""
    group = parser.add_mutually_exclusive_group()
    default = compilation_cache.default_dir()
    group.add_argument("--cache", metavar="DIR", default=None,
                       help=f"keep compiled programs in DIR for the next run (default {default})")
    group.add_argument("--no-cache", action="store_true", help="compile from scratch and keep nothing")


def apply_cache_arguments(args: argparse.Namespace) -> None:
    """Turns the persistent compilation cache on as ``args`` say; a sub-command without the options is left alone.

    Raises:
      UsageError: the folder cannot be created (``--cache`` named, with the operating system's reason).
    """
    if not hasattr(args, "no_cache") or args.no_cache:
        return
    try:
        compilation_cache.enable(args.cache)
    except CacheFolderError as e:
        raise UsageError(f"--cache {args.cache or compilation_cache.default_dir()}: "
                         f"cannot create the folder ({e.reason})") from e


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def byte_count(text: str) -> int:
    """``2GB``, ``500MB``, ``1GiB`` or a plain byte count, as bytes (argparse type)."""
    number = text.strip().upper().rstrip("BIGKM") or "0"
    unit = text.strip().upper()[len(number) :]
    try:
        value = float(number) * _UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"expected a size such as 2GB, 500MB or 1048576, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the size must be at least one byte, got {text!r}")
    return int(value)


def scan_setting(choice: str) -> bool | str:
    """The ``scan_layers`` argument of ``onnx2jax.translate`` for a ``--scan-layers`` choice."""
    return _SCAN_CHOICES[choice]


XLA_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
"""The variable XLA's C++ log reads once, when jaxlib loads: 2 keeps its errors and drops its warnings and info."""


def quiet_xla_log(debug: bool = False) -> None:
    """Keeps XLA's own C++ log lines (``W... spmd_partitioner.cc:656] [SPMD] Involuntary full
    rematerialization ...``, many lines of HLO each) off the command's stderr, where every warning is one
    line (onnx2jax's own notes say what the plan costs: collectives, reshards).

    Sets ``TF_CPP_MIN_LOG_LEVEL=2`` before JAX is imported (later it has no effect), unless the user set it
    or asked for ``--debug`` (``ONNX2JAX_DEBUG=1``), which let XLA's lines through as they are.
    """
    if "jax" not in sys.modules and not debug_requested(debug):
        os.environ.setdefault(XLA_LOG_LEVEL, "2")


def synchronous_cpu_dispatch() -> None:
    """Runs each XLA CPU execution on the calling thread (``jax_cpu_enable_async_dispatch`` off), for the
    commands whose every step reads its result to the host before the next one starts (``generate``, which
    streams each token, and ``serve``): there asynchronous dispatch overlaps nothing and only adds a hand-off
    to a worker thread and back per call, ~60-100 us of CPU a token on the tiny fixtures (bench/RESULTS.md,
    "Generation's per-call cost"). Set before the CPU backend starts (it is read once, then); no effect on
    another platform. The library leaves JAX's default to its caller (docs/generation.md says when to set it).
    """
    import jax

    jax.config.update("jax_cpu_enable_async_dispatch", False)


CPU_THREADS_ENV = "PJRT_NPROC"
"""The variable jaxlib's CPU client reads once, when it starts, for the size of XLA's intra-op thread pool (the
threads one execution's fusions and dots are split over); XLA's compiler splits a fusion over at most that many."""

SMALL_MODEL_BYTES = 32 << 20
"""Weights under this many bytes make ``serve``'s steps too small for XLA's intra-op threads to pay (see
:func:`serve_cpu_threads`)."""


def serve_cpu_threads(folder: str, requested: int | None, devices: int) -> int | None:
    """The intra-op threads ``onnx2jax serve`` asks XLA for on CPU: ``requested`` where given; else one for a
    one-device model whose weight files (``*.onnx``, ``*.data``) hold under `SMALL_MODEL_BYTES`, else None (XLA's
    default, a thread per core).

    Why one for a small model: XLA splits a step's larger fusions (the gathers of the cache pages, the scatters
    into them) over its pool and runs the step's kernels there; on a step of a few hundred microseconds those
    hand-offs cost more than they save (the tiny fixture's 16-row decode step: 0.44-0.53 ms of CPU with a
    thread per core, 0.32-0.41 ms with one; bench/RESULTS.md, "Serving, per step"). A larger model's steps
    gain from the second core when it is free (the 6 x 512 fixture: 20-40% of its tokens/s).
    """
    if requested is not None:
        return requested
    if devices > 1:
        return None
    weights = sum(entry.stat().st_size for entry in os.scandir(folder)
                  if entry.is_file() and entry.name.endswith((".onnx", ".data", ".onnx_data")))
    return 1 if weights < SMALL_MODEL_BYTES else None


def limit_cpu_threads(count: int, chosen: bool = False) -> None:
    """Asks jaxlib's CPU client for ``count`` intra-op threads (``PJRT_NPROC``), before the backend starts (it
    reads the variable once, then). A value the user set in the environment wins over a default, not over a
    count ``chosen`` on the command line."""
    if chosen:
        os.environ[CPU_THREADS_ENV] = str(count)
    else:
        os.environ.setdefault(CPU_THREADS_ENV, str(count))


def ensure_devices(count: int) -> None:
    """Asks JAX for ``count`` CPU devices when the machine has fewer (before JAX starts)."""
    import jax  # only the sub-commands that run a model start JAX

    if os.environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError:
            pass  # the backend already started; jax.devices() says how many there are
    have = jax.devices()
    if len(have) < count:
        raise CliError(
            f"{count} devices needed, JAX has {len(have)} ({have[0].platform}); pass --devices {len(have)}, "
            "or set JAX_PLATFORMS=cpu to run on fake CPU devices"
        )
