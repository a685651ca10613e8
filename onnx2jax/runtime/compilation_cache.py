"""JAX's persistent compilation cache, which the CLI turns on by default.

A process that compiled a model writes the XLA executable to a folder; the
next process that traces the same program reads it back instead of compiling
again, so a second start costs the trace and the load, not XLA's compile.
Keys cover the program, the jax/jaxlib version, the devices and the compile
options, so a stale entry is never used.

The Python API leaves the cache to the user (it is a process-wide jax
setting); :func:`enable` is the one call that turns it on (see docs/cli.md, "Compilation cache"). The
command line's ``--cache DIR`` / ``--no-cache`` are :mod:`onnx2jax.cli.options`'.

Where the CLI keeps it (:func:`default_dir`): ``$ONNX2JAX_CACHE_DIR`` when set, else
``$XDG_CACHE_HOME/onnx2jax/xla``, else ``~/.cache/onnx2jax/xla``. Deleting the folder clears it
(``rm -rf ~/.cache/onnx2jax/xla``); ``--no-cache`` runs without it. The test suite points
``ONNX2JAX_CACHE_DIR`` at a temporary folder (``tests/conftest.py``), so tests leave nothing there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Iterator

from onnx2jax.errors import CacheFolderError


ENVIRONMENT = "ONNX2JAX_CACHE_DIR"


def default_dir() -> str:
    """``$ONNX2JAX_CACHE_DIR``, else ``$XDG_CACHE_HOME/onnx2jax/xla``, else ``~/.cache/onnx2jax/xla``."""
    if os.environ.get(ENVIRONMENT):
        return os.environ[ENVIRONMENT]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "onnx2jax", "xla")


def enable(path: str | None = None) -> str:
    """Turns on JAX's persistent compilation cache in ``path`` (default :func:`default_dir`); returns it.

    Every executable is cached, however quickly it compiled (jax's default skips
    those under one second, which is most onnx2jax models on CPU).

    Raises:
      CacheFolderError: the folder cannot be created (an ``OSError``).
    """
    import jax

    path = os.path.abspath(os.path.expanduser(path or default_dir()))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise CacheFolderError(path, e.strerror or str(e)) from e
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path


@dataclasses.dataclass
class Lookups:
    """Persistent-cache lookups seen by :func:`watch`: executables loaded from the cache, and compiled."""

    hits: int = 0
    misses: int = 0

    def describe(self) -> str:
        """How the executables of the watched calls were obtained, for a timing line."""
        if self.hits and not self.misses:
            return "executable from cache"
        if self.hits:
            return f"compile {self.misses} of {self.hits + self.misses} programs, the rest from cache"
        return "compile"


_HIT, _MISS = "/jax/compilation_cache/cache_hits", "/jax/compilation_cache/cache_misses"


@contextlib.contextmanager
def watch() -> Iterator[Lookups]:
    """Counts the persistent-cache hits and misses of the calls in the ``with`` block (jax's monitoring events).

    Both stay 0 when the cache is off.
    """
    import jax

    lookups = Lookups()

    def listen(event: str, **kwargs) -> None:
        if event == _HIT:
            lookups.hits += 1
        elif event == _MISS:
            lookups.misses += 1

    jax.monitoring.register_event_listener(listen)
    try:
        yield lookups
    finally:
        jax.monitoring.unregister_event_listener(listen)
