"""The one place onnx2jax enters jax's x64 mode: :func:`x64_scope`.

A model with 64-bit tensors (int64 ids, float64 weights) keeps them 64-bit
only while jax's x64 mode is on; onnx2jax never switches it on globally, but
for each call, trace, placement or export of such a model. Every such entry
goes through :func:`x64_scope`, so that the rule lives in one module, below
both the translation (:mod:`onnx2jax.translate`) and the runtime
(:mod:`onnx2jax.runtime`), which both import it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax


@contextlib.contextmanager
def x64_scope(uses_64bit: bool) -> Iterator[None]:
    """64-bit types for one call of a model that has 64-bit tensors, never switched on globally.

    With ``uses_64bit`` False the mode is left as the user set it (on stays on).
    """
    with jax.enable_x64(uses_64bit or jax.config.jax_enable_x64):
        yield
