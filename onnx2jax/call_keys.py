"""The key of one call's input signature (:func:`call_key`), which every repeated call looks up.

The inputs' types, shapes, dtypes and (for jax.Arrays) shardings: what a call's placement and program
depend on. :class:`onnx2jax.translate.JaxModel` binds a signature its input checks accepted once without
checking again; :class:`onnx2jax.runtime.spmd.Compiled` keeps its short path per key
(:mod:`onnx2jax.runtime.fast_call`). Its own module, below both, so that the translation does not import
the runtime.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import jax
import numpy as np


def _value_key(value: Any) -> Hashable | None:
    """What one input's placement and program depend on; None when only the full path can tell."""
    kind = type(value)
    if kind is np.ndarray:
        return (value.shape, value.dtype)
    if isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer):
        return (value.shape, value.dtype, value.sharding)
    return None  # Python scalars, lists, tracers: bind_inputs and the trace decide


def call_key(inputs: Sequence[Any], named: Mapping[str, Any]) -> Hashable | None:
    """The key of one call's input signature, or None when it has no short path."""
    keys = []
    for value in inputs:
        key = _value_key(value)
        if key is None:
            return None
        keys.append(key)
    for name, value in named.items():
        key = _value_key(value)
        if key is None:
            return None
        keys.append((name, key))
    return tuple(keys)
