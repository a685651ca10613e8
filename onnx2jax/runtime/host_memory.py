"""Host memory a compile leaves behind, given back before the program runs (generation's peak, issue 28).

On one CPU device a loaded model's parameters alias its memory-mapped weights file
(:func:`onnx2jax.loading.read_only_buffer`, jax's zero-copy placement): the pages a run reads count in the
process's memory until the kernel reclaims them. XLA's compiler needs some 60-80 MB of working memory for a
real-size decoder's program; compiled after a run (the decode program after the prefill), that working memory
adds to every weight page already read, and glibc keeps most of it in its heap once freed.

:func:`before_compile` lets the kernel drop the weights' resident file pages (they are read-only and private:
the next run faults them back in from the page cache, the same bytes), and :func:`after_compile` hands the heap
glibc kept back to the kernel (``malloc_trim``), so that a program compiled while the weights are resident does
not raise the peak. Both are no-ops where they do not apply (weights held in device buffers, another libc).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Iterable

import numpy as np

from onnx2jax.loading import drop_pages


def before_compile(arrays: Iterable[np.ndarray]) -> None:
    """Lets the kernel drop the resident pages of the file mappings behind ``arrays`` (once per mapping)."""
    seen: set[int] = set()
    for array in arrays:
        base = array
        while isinstance(getattr(base, "base", None), np.ndarray):
            base = base.base
        if isinstance(base, np.memmap) and id(base) not in seen:
            seen.add(id(base))
            drop_pages(array)


def after_compile() -> None:
    """Returns the freed memory glibc's heap keeps to the kernel (``malloc_trim(0)``; nothing without glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


_TRIM: list = []


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where the C library has none."""
    if not _TRIM:
        name = ctypes.util.find_library("c")
        try:
            _TRIM.append(getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None)
        except OSError:
            _TRIM.append(None)
    return _TRIM[0]


__all__ = ["after_compile", "before_compile"]
