"""The index check of :mod:`onnx2jax.input_checks` on device, for calls traced under ``jax.jit``.

A call's concrete arrays are checked on the host before the call (``InputRangeError``). Under
``jax.jit`` the inputs are tracers, so that check cannot see them; here the same bounds become
``checkify.check`` s, which :meth:`onnx2jax.runtime.spmd.Compiled.checked_apply` functionalizes: it
returns a ``checkify.Error`` beside the outputs, and ``error.throw()`` raises, naming the input, the
node and the table, when a token id was out of range.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from jax.experimental import checkify

from onnx2jax.input_checks import IndexUse


def check_on_device(uses: list[IndexUse], inputs: Mapping[str, Any]) -> None:
    """One ``checkify.check`` per index input and bound: every value in ``[-bound, bound)``."""
    for use in uses:
        value = inputs.get(use.input)
        if value is None or not jnp.issubdtype(jnp.result_type(value), jnp.integer):
            continue
        value = jnp.asarray(value)
        if len(use.bounds) == 1:
            _check(use, value, use.bounds[0], None)
        elif value.ndim >= 1 and value.shape[-1] <= len(use.bounds):
            for component in range(value.shape[-1]):
                _check(use, value[..., component], use.bounds[component], component)


def _check(use: IndexUse, values, size: int, component: int | None) -> None:
    what = f"coordinate {component} of " if component is not None else ""
    checkify.check(
        jnp.all((values >= -size) & (values < size)),
        f"input {use.input!r} holds a value outside [{-size}, {size}): node {use.node!r} ({use.op}) indexes "
        f"{what}{use.table!r}, which has {size} entries there (onnxruntime refuses it; XLA would answer with "
        "clamped or NaN rows)",
    )


__all__ = ["check_on_device"]
