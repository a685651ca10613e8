"""The ``onnx2jax`` command line: the parser and the dispatch, nothing else.

One convention for every sub-command: a module ``onnx2jax/cli/<command>.py`` exposes
``add_parser(subparsers) -> ArgumentParser`` and ``run(args) -> int`` (the exit status); `COMMANDS`
lists them in help order. Adding a command is one module and one entry there. Errors print as one line
(:mod:`onnx2jax.cli.errors`). A sub-command module imports jax only on the path that runs a model, so
``onnx2jax --help`` and ``onnx2jax check`` start without it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Sequence

from onnx2jax import __version__
from onnx2jax import bundled
from onnx2jax.cli import (
    annotate, bench, check, conformance, data, demo, explain, export, generate, run, serve, targets,
)
from onnx2jax.cli.errors import run_guarded
from onnx2jax.cli.options import apply_cache_arguments, quiet_xla_log

COMMANDS = (demo, run, generate, serve, conformance, annotate, check, explain, bench, export, targets, data)


def build_parser() -> argparse.ArgumentParser:
    """The ``onnx2jax`` parser: one sub-parser per module of `COMMANDS`, each given ``--debug``."""
    parser = argparse.ArgumentParser(
        prog="onnx2jax",
        description="Run ONNX models on JAX/XLA, sharded from ONNX's multi-device annotations.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--debug", action="store_true", help=_DEBUG_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    for command in COMMANDS:
        command.add_parser(sub).set_defaults(handler=command.run)
    _finish(parser, sub)
    return parser


_DEBUG_HELP = "show the Python traceback of an error, and XLA's own log lines (also ONNX2JAX_DEBUG=1)"


def _plain(text: str | None) -> str | None:
    """A module docstring as help text: reStructuredText's ``code``, `refs` and ``Examples::`` made plain."""
    if text is None:
        return None
    text = re.sub(r"``([^`]+)``", r"\1", text)
    text = re.sub(r":\w+:`([^`]+)`|`([^`]+)`", lambda m: m.group(1) or m.group(2), text)
    return re.sub(r"::$", ":", text, flags=re.MULTILINE)


def _finish(parser: argparse.ArgumentParser, sub: argparse._SubParsersAction) -> None:
    """Names every sub-command in the top-level description, and gives each one ``--debug``."""
    names = ", ".join(sub.choices)
    parser.description = f"{parser.description}\n\ncommands: {names} (onnx2jax COMMAND --help for each)"
    for child in sub.choices.values():
        child.description = _plain(child.description)
        child.formatter_class = argparse.RawDescriptionHelpFormatter  # examples one per line, as written
        # SUPPRESS: absent from the namespace unless given, so the top-level flag stays.
        child.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=_DEBUG_HELP)


def resolve_data_names(args: argparse.Namespace) -> None:
    """Makes every ``data:NAME`` among the model and input-file arguments the shipped file's path (:mod:`onnx2jax.bundled`).

    Raises:
      FileNotFoundError: a ``data:NAME`` that names no shipped file (the message lists those that ship).
    """
    for attribute in ("model", "models"):
        value = getattr(args, attribute, None)
        if isinstance(value, str):
            setattr(args, attribute, bundled.resolve(value))
        elif isinstance(value, list):
            setattr(args, attribute, [bundled.resolve(v) for v in value])
    if isinstance(getattr(args, "input", None), list):
        args.input = [_resolve_input(item) for item in args.input]


def _resolve_input(item: str) -> str:
    """``--input NAME=data:FILE`` or ``--input data:FILE.npz`` with the shipped file's path."""
    name, sep, path = item.partition("=")
    if sep and not name.startswith(bundled.PREFIX):
        return f"{name}={bundled.resolve(path)}"
    return bundled.resolve(item)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``onnx2jax`` script: parses, runs one sub-command, returns the exit status."""
    args = build_parser().parse_args(argv)
    quiet_xla_log(args.debug)

    def dispatch() -> int:
        resolve_data_names(args)
        apply_cache_arguments(args)
        return args.handler(args)

    try:
        return run_guarded(args.command, dispatch, args.debug)
    except BrokenPipeError:
        # The reader went away (``onnx2jax ... | head``): stop quietly, and keep Python
        # from complaining again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
