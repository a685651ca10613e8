"""How the ``onnx2jax`` command line turns exceptions into one line and an exit status.

Every sub-command runs inside :func:`run_guarded`: an ordinary mistake (a
missing file, a file that is not ONNX, a wrong input name, too few devices,
an unsupported op, invalid annotations) is printed as one line on stderr,
``onnx2jax run: error: ...``, naming the problem and what to do, with exit
status 1; a malformed option value is a usage error, exit status 2.
``--debug`` (or ``ONNX2JAX_DEBUG=1``) re-raises instead, so the traceback
shows. Sub-commands raise :class:`CliError` / :class:`UsageError` for
mistakes they detect themselves; the library's own exceptions are mapped
here, so no sub-command needs its own ``try``/``except``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator

from google.protobuf.message import DecodeError
from onnx.checker import ValidationError

from onnx2jax.errors import (
    MeshMappingError,
    ModelLoadError,
    NodeError,
    PrecisionError,
    ShardingError,
    SpecSyntaxError,
    UnsupportedOpError,
)

USER_ERROR = 1
USAGE_ERROR = 2


class CliError(Exception):
    """A mistake the user can fix: printed as one line, exit status 1."""

    exit_code = USER_ERROR


class UsageError(CliError):
    """A malformed option or argument: printed as one line, exit status 2."""

    exit_code = USAGE_ERROR


def check_writable(option: str, path: str | None, suffix: str) -> None:
    """Fails before any long work when an output file has the wrong suffix or no folder."""
    if path is None:
        return
    if not path.endswith(suffix):
        raise UsageError(f"{option} writes a {suffix} file; got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: folder {folder} does not exist")


def install_hint(extra: str, packages: str) -> str:
    """How to install one of onnx2jax's extras: the packages themselves, or the extra from a clone of the
    repository (onnx2jax is on no package index, so ``pip install 'onnx2jax[EXTRA]'`` finds nothing)."""
    return f"pip install {packages} (in a clone of onnx2jax: pip install -e '.[{extra}]')"


def require_matplotlib(option: str = "--plot") -> None:
    """Fails before any long work when matplotlib (the ``plot`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401 - optional: only tried here, imported for real by the plotting code
    except ImportError as e:
        raise CliError(f"{option} needs matplotlib: {install_hint('plot', 'matplotlib')}") from e


def debug_requested(flag: bool = False) -> bool:
    """True when ``--debug`` was given or ``ONNX2JAX_DEBUG`` is set to a true value."""
    return flag or os.environ.get("ONNX2JAX_DEBUG", "").lower() in ("1", "true", "yes", "on")


# The library's exceptions that describe the user's input, not a bug of onnx2jax.
USER_ERROR_TYPES: tuple[type[BaseException], ...] = (
    ModelLoadError, UnsupportedOpError, NodeError, PrecisionError, MeshMappingError,
    ShardingError, SpecSyntaxError, DecodeError, ValidationError, OSError, ValueError,
)


def describe(error: BaseException) -> str:
    """The message printed for ``error``: what went wrong, and what to do where that is known."""
    if isinstance(error, ShardingError) and error.diagnostics:
        return describe_sharding_error(error)
    if isinstance(error, FileNotFoundError) and error.filename is not None:
        return f"no such file or directory: {error.filename}"
    if isinstance(error, IsADirectoryError) and error.filename is not None:
        return f"{error.filename} is a directory; give a file"
    if isinstance(error, PermissionError) and error.filename is not None:
        return f"permission denied: {error.filename}"
    cause = error.__cause__
    if isinstance(error, ModelLoadError) and isinstance(cause, FileNotFoundError) and cause.filename:
        return f"no such file: {cause.filename}"
    if isinstance(error, UnsupportedOpError):
        return f"{error} (onnx2jax conformance lists what is implemented)"
    text = str(error).strip() or type(error).__name__
    return text


MAX_DETAIL_LINES = 10


def describe_sharding_error(error: ShardingError) -> str:
    """One line naming the first error's code, node, tensor and axis; then each error on an indented line.

    ``onnx2jax run: error: 3 sharding errors; first: axis-out-of-range at node
    'mm' (MatMul), tensor 'X', axis 7`` and, below it, ``  error[...] ...`` per
    error (at most `MAX_DETAIL_LINES`; ``onnx2jax check`` lists them all).
    """
    errors = [d for d in error.diagnostics if d.severity == "error"] or list(error.diagnostics)
    first = errors[0]
    where = f" at {first.location}" if first.location else ""
    noun = "sharding error" if len(errors) == 1 else "sharding errors"
    lines = [f"{len(errors)} {noun}; first: {first.code}{where}"]
    lines += [f"  {d}" for d in errors[:MAX_DETAIL_LINES]]
    if len(errors) > MAX_DETAIL_LINES:
        lines.append(f"  ... and {len(errors) - MAX_DETAIL_LINES} more (onnx2jax check MODEL lists them all)")
    return "\n".join(lines)


def run_guarded(command: str, func: Callable[[], int], debug: bool = False) -> int:
    """Runs one sub-command; maps its exceptions to one line on stderr and an exit status.

    Warnings the library issues meanwhile (Python's ``warnings``) print as the command's own notes,
    ``onnx2jax run: note: ...``, without Python's source line and category (:func:`notes_for`); in
    Python they stay warnings.
    """
    debug = debug_requested(debug)
    prefix = f"onnx2jax {command}: " if command else "onnx2jax: "
    try:
        with notes_for(prefix):
            return func()
    except CliError as e:
        if debug:
            raise
        hint = f" (onnx2jax {command} --help)" if isinstance(e, UsageError) and command else ""
        _say(f"{prefix}error: {e}{hint}")
        return e.exit_code
    except SystemExit as e:  # argparse, and messages raised as SystemExit("...")
        if isinstance(e.code, str):
            if debug:
                raise
            _say(f"{prefix}error: {e.code}")
            return USER_ERROR
        raise
    except KeyboardInterrupt:
        if debug:
            raise
        _say(f"{prefix}interrupted")
        return 130
    except BrokenPipeError:
        raise  # handled by main(): the reader (| head) went away
    except Exception as e:  # noqa: BLE001 - the one place that turns exceptions into messages
        if debug:
            raise
        if isinstance(e, USER_ERROR_TYPES):
            _say(f"{prefix}error: {describe(e)}")
        else:
            _say(
                f"{prefix}internal error: {type(e).__name__}: {describe(e)} "
                "(rerun with --debug for the traceback and report it)"
            )
        return USER_ERROR


@contextlib.contextmanager
def notes_for(prefix: str) -> Iterator[None]:
    """Inside the ``with`` block, a warning shown prints as ``PREFIXnote: MESSAGE`` on stderr, one line.

    Which warnings show is left to Python's filters (each once per place by default, ``-W`` and
    ``PYTHONWARNINGS`` obeyed); only their form changes. The previous handler comes back on exit.
    """

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())  # one line, whatever the message's own breaks
        print(f"{prefix}note: {text}", file=sys.stderr if file is None else file, flush=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
