"""ai.onnx.ml encoders: LabelEncoder, CategoryMapper, OneHotEncoder, ZipMap.

They map between numbers and strings. JAX has no strings, so (as in
:mod:`onnx2jax.ops.strings`) a string *input* is a value known while tracing
(a string graph input is a compile-time constant: one compile per distinct
value) and the lookup runs in numpy. A numeric input may be traced: the
lookup is a comparison against the keys, and a string *output* chosen by it
is a :class:`~onnx2jax.hostvalues.StringLabels`, finished on the host when
the model is called. ZipMap's sequence of maps is a
:class:`~onnx2jax.hostvalues.MapSequence`, finished into a list of
``{label: probability}`` dicts, as onnxruntime returns it.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.hostvalues import MapSequence, StringLabels
from onnx2jax.ops.ml_common import ML, is_traced
from onnx2jax.ops.registry import register


def _text(values) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.asarray(values, dtype=object).reshape(-1)]


def _is_string(x) -> bool:
    return isinstance(x, (np.ndarray, np.generic)) and np.asarray(x).dtype.kind in "OUS"


def _as_host_strings(x) -> np.ndarray:
    x = np.asarray(x)
    return np.array(_text(x), dtype=object).reshape(x.shape)


def _lookup(x, keys: Sequence, values: Sequence, default: Any, dtype: np.dtype | None, op: str):
    """``values[keys.index(v)]`` for each element ``v`` of ``x``, ``default`` where absent.

    ``dtype``: the output's numpy dtype, None for strings. Float keys match
    NaN to NaN. Strings on either side follow the module docstring.
    """
    if not is_traced(x):
        host = _as_host_strings(x) if _is_string(x) else np.asarray(x)
        table: dict = {}
        for k, v in zip(keys, values):
            table.setdefault(k, v)
        nan_keys = [v for k, v in zip(keys, values) if isinstance(k, float) and np.isnan(k)]

        def one(v):
            if nan_keys and isinstance(v, float) and np.isnan(v):
                return nan_keys[0]
            return table.get(v, default)

        flat = [one(v) for v in host.reshape(-1).tolist()]
        return np.array(flat, dtype=object if dtype is None else dtype).reshape(host.shape)
    if keys and isinstance(keys[0], str):
        raise TypeError(f"{op}: string keys need a string input, got a traced {x.dtype} tensor")
    key_array = np.asarray(keys)
    match = x[..., None] == key_array
    if key_array.dtype.kind == "f":
        match = match | (jnp.isnan(x)[..., None] & np.isnan(key_array))
    position = jnp.argmax(match, axis=-1)
    found = jnp.any(match, axis=-1)
    if dtype is None:
        return StringLabels(tuple(values) + (default,), jnp.where(found, position, len(values)))
    return jnp.where(found, jnp.asarray(np.asarray(values, dtype))[position], np.asarray(default, dtype))


def _tensor_values(tensor) -> tuple[list, np.dtype | None]:
    """A tensor attribute's values as a list, and their dtype (None for strings)."""
    array = np.asarray(tensor)
    if array.dtype.kind in "OUS":
        return _text(array), None
    return array.reshape(-1).tolist(), array.dtype


@register("LabelEncoder", 1, domain=ML)
def label_encoder_1(x, *, classes_strings=None, default_int64, default_string):
    """String -> its index in ``classes_strings``, or int64 -> the string at that index."""
    classes = list(classes_strings or ())
    indices = list(range(len(classes)))
    if _is_string(x):
        return _lookup(x, classes, indices, default_int64, np.dtype(np.int64), "LabelEncoder")
    return _lookup(x, indices, classes, default_string, None, "LabelEncoder")


@register("LabelEncoder", 2, 4, domain=ML)
def label_encoder(
    x, *, keys_floats=None, keys_int64s=None, keys_strings=None, keys_tensor=None,
    values_floats=None, values_int64s=None, values_strings=None, values_tensor=None,
    default_float, default_int64, default_string, default_tensor=None,
):
    """Maps each element through ``keys -> values`` (one kind of each), ``default`` where absent."""
    if keys_tensor is not None:
        keys, _ = _tensor_values(keys_tensor)
    else:
        keys = list(keys_floats or keys_int64s or keys_strings or ())
    if values_tensor is not None:
        values, dtype = _tensor_values(values_tensor)
        if default_tensor is not None:
            default = _tensor_values(default_tensor)[0][0]
        else:  # the schema's defaults for the other attribute kinds
            default = "_Unused" if dtype is None else -1 if dtype.kind in "iu" else -0.0
    elif values_floats:
        values, dtype, default = list(values_floats), np.dtype(np.float32), default_float
    elif values_int64s:
        values, dtype, default = list(values_int64s), np.dtype(np.int64), default_int64
    else:
        values, dtype, default = list(values_strings or ()), None, default_string
    if not keys or len(keys) != len(values):
        raise ValueError(f"LabelEncoder needs keys and values of one length, got {len(keys)} and {len(values)}")
    return _lookup(x, keys, values, default, dtype, "LabelEncoder")


@register("CategoryMapper", 1, domain=ML)
def category_mapper(x, *, cats_int64s=None, cats_strings=None, default_int64, default_string):
    """String -> int64 through the pairs (``cats_strings[i]``, ``cats_int64s[i]``), or int64 -> string."""
    ints, strings = list(cats_int64s or ()), list(cats_strings or ())
    if len(ints) != len(strings):
        raise ValueError(f"CategoryMapper: {len(strings)} strings for {len(ints)} ints")
    if _is_string(x):
        return _lookup(x, strings, ints, default_int64, np.dtype(np.int64), "CategoryMapper")
    return _lookup(x, ints, strings, default_string, None, "CategoryMapper")


@register("OneHotEncoder", 1, domain=ML)
def one_hot_encoder(x, *, cats_int64s=None, cats_strings=None, zeros):
    """[..., C] float32 one-hot rows over the categories; numbers are read as int64.

    With ``zeros=0`` a value outside the categories is an error: raised while
    tracing for a known input, and by a host callback when the program runs
    for a traced one.
    """
    if cats_int64s:
        cats: list = list(cats_int64s)
    elif cats_strings:
        cats = list(cats_strings)
    else:
        raise ValueError("OneHotEncoder has no categories")
    if _is_string(x) or not is_traced(x):
        host = _as_host_strings(x) if _is_string(x) else np.asarray(x).astype(np.int64)
        if isinstance(cats[0], str) != _is_string(x):
            raise TypeError(f"OneHotEncoder: {'string' if _is_string(x) else 'numeric'} input for the other kind of categories")
        index = {c: i for i, c in enumerate(cats)}
        positions = np.array([index.get(v, -1) for v in host.reshape(-1).tolist()], dtype=np.int64).reshape(host.shape)
        if not zeros and (positions < 0).any():
            raise ValueError(f"OneHotEncoder: values {sorted(set(host[positions < 0].tolist()))[:5]} are not categories (zeros=0)")
        return (positions[..., None] == np.arange(len(cats))).astype(np.float32)
    if isinstance(cats[0], str):
        raise TypeError("OneHotEncoder: string categories need a string input, got a numeric tensor")
    hot = x.astype(jnp.int64)[..., None] == np.asarray(cats, np.int64)
    if not zeros:
        jax.debug.callback(_refuse_unknown, jnp.all(jnp.any(hot, axis=-1)))
    return hot.astype(jnp.float32)


def _refuse_unknown(all_known) -> None:
    if not bool(all_known):
        raise ValueError("OneHotEncoder: a value is not one of the categories (zeros=0)")


@register("ZipMap", 1, domain=ML)
def zip_map(x, *, classlabels_int64s=None, classlabels_strings=None):
    """One ``{label: probability}`` map per row of ``x`` [N, C], as a :class:`MapSequence`."""
    keys = tuple(int(k) for k in classlabels_int64s) if classlabels_int64s else tuple(classlabels_strings or ())
    if not keys:
        raise ValueError("ZipMap has no class labels")
    if x.ndim != 2 or x.shape[1] != len(keys):
        raise ValueError(f"ZipMap: input of shape {tuple(x.shape)} for {len(keys)} labels (expected [N, {len(keys)}])")
    return MapSequence(keys, x)
