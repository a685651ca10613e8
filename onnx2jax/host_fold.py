"""Folding integer and boolean constants with numpy on the host, while tracing.

A node whose inputs are all known while tracing is folded into a constant
(:mod:`onnx2jax.graph_runner`). The op implementations are jax-based, and jax
runs each eager op as its own small XLA program, compiled on first use: a
torch export of GPT-2 computes its causal mask and position ids this way
(CumSum, GatherND, comparisons, And/Not, Max, Cast) and compiled 52 such
programs before the model's own, about 1.1 s of its first call (issue 21).

Here are numpy equivalents for the ops those shape and mask computations use,
taken only where numpy's result is exactly jax's: integer and boolean inputs
(wrapping integer arithmetic, comparisons, logic), selections (GatherND, Where)
of any non-string numeric type, and Casts from integers or booleans to the
plain numpy types. Anything else (floats through arithmetic, where rounding
and denormal handling could differ; legacy broadcast attributes; an index out
of range, which numpy refuses) returns ``None`` and the node runs through its
jax implementation as before.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper

_EXACT = "iub"  # integer, unsigned, bool: numpy and XLA agree bit for bit
_SELECTABLE = "iubf"  # picked, not computed: any of these is copied exactly
_PLAIN_TARGETS = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64,
))


def _exact(*values: np.ndarray) -> bool:
    return all(np.asarray(v).dtype.kind in _EXACT for v in values)


def _selectable(value: np.ndarray) -> bool:
    dtype = np.asarray(value).dtype
    return dtype.kind in _SELECTABLE and dtype in _PLAIN_TARGETS


def _elementwise(fn: Callable, *, variadic: bool = False) -> Callable:
    def fold(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray | None:
        if set(attrs) - {"consumed_inputs"} or not _exact(*inputs) or (not variadic and len(inputs) > 2):
            return None
        if len({np.asarray(v).dtype for v in inputs}) > 1:
            return None  # ONNX gives both one type; leave anything else to jax's promotion
        return functools.reduce(fn, inputs) if len(inputs) > 1 else fn(inputs[0])

    return fold


def _where(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray | None:
    condition, x, y = inputs
    if np.asarray(condition).dtype != np.bool_ or not (_selectable(x) and _selectable(y)):
        return None
    if np.asarray(x).dtype != np.asarray(y).dtype:
        return None
    return np.where(condition, x, y)


def _gather_nd(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray | None:
    x, indices = (np.asarray(v) for v in inputs)
    if not _selectable(x) or indices.dtype.kind not in "iu":
        return None
    b = int(attrs.get("batch_dims", 0))
    k = indices.shape[-1]
    dims = np.asarray(x.shape[b : b + k], dtype=indices.dtype)
    indices = np.where(indices < 0, indices + dims, indices)
    if np.any(indices < 0) or np.any(indices >= dims):
        return None  # out of range: jax's implementation decides what that means
    batch_shape = x.shape[:b]
    batch = int(np.prod(batch_shape, dtype=np.int64))
    flat_x = x.reshape((batch, *x.shape[b:]))
    flat_i = indices.reshape((batch, *indices.shape[b:]))
    rows = np.arange(batch).reshape((batch,) + (1,) * (flat_i.ndim - 2))
    picked = flat_x[(rows, *(flat_i[..., j] for j in range(k)))]
    return picked.reshape((*batch_shape, *indices.shape[b:-1], *x.shape[b + k :]))


def _cum_sum(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray | None:
    x, axis = (np.asarray(v) for v in inputs)
    if not _exact(x) or x.dtype == np.bool_ or x.ndim == 0:
        return None
    axis = int(axis.reshape(-1)[0])
    axis = axis + x.ndim if axis < 0 else axis
    if attrs.get("reverse"):
        x = np.flip(x, axis)
    out = np.cumsum(x, axis=axis, dtype=x.dtype)
    if attrs.get("exclusive"):
        out = out - x  # [a, a+b, a+b+c] -> [0, a, a+b], exact in wrapping integers
    return np.flip(out, axis) if attrs.get("reverse") else out


def _cast(inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray | None:
    (x,) = inputs
    to = attrs["to"]
    if isinstance(to, str) or to == onnx.TensorProto.STRING or not _exact(x):
        return None
    target = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to))
    if target not in _PLAIN_TARGETS or (target.kind == "f" and np.asarray(x).dtype == np.uint64):
        return None
    return np.asarray(x).astype(target)


_FOLDS: dict[str, Callable[[Sequence[np.ndarray], Mapping[str, Any]], np.ndarray | None]] = {
    "Add": _elementwise(np.add),
    "Sub": _elementwise(np.subtract),
    "Mul": _elementwise(np.multiply),
    "Max": _elementwise(np.maximum, variadic=True),
    "Min": _elementwise(np.minimum, variadic=True),
    "Sum": _elementwise(np.add, variadic=True),
    "Neg": _elementwise(np.negative),
    "Abs": _elementwise(np.abs),
    "Equal": _elementwise(np.equal),
    "Less": _elementwise(np.less),
    "LessOrEqual": _elementwise(np.less_equal),
    "Greater": _elementwise(np.greater),
    "GreaterOrEqual": _elementwise(np.greater_equal),
    "And": _elementwise(np.logical_and),
    "Or": _elementwise(np.logical_or),
    "Xor": _elementwise(np.logical_xor),
    "Not": _elementwise(np.logical_not),
    "Where": _where,
    "GatherND": _gather_nd,
    "CumSum": _cum_sum,
    "Cast": _cast,
}
"""op type -> numpy fold of the default domain's op (every opset these ops share one meaning at these types)."""


def fold(domain: str, op_type: str, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> np.ndarray | None:
    """``op_type``'s result on static ``inputs`` computed with numpy, or None where only jax may compute it."""
    fn = _FOLDS.get(op_type) if domain == "" else None
    if fn is None or any(v is None for v in inputs):
        return None
    if op_type in ("Neg", "Abs") and np.asarray(inputs[0]).dtype.kind == "b":
        return None
    try:
        with np.errstate(all="ignore"):  # integer arithmetic wraps, as XLA's does
            result = fn(inputs, attrs)
    except (ValueError, IndexError, TypeError):  # a case numpy refuses: jax's implementation says what it means
        return None
    return None if result is None else np.asarray(result)
