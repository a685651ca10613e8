"""DictVectorizer and CastMap (ai.onnx.ml): a map input (a Python dict) made a tensor, on the host.

skl2onnx exports a DictVectorizer pipeline with one ``{feature: value}`` map
as its input. XLA holds no maps, so a node that reads one runs on the host as
a step between jitted segments (:mod:`sharding.segments`), and the jitted
programs see only the tensor it makes. Calling the model binds a dict given
for a map input as a :class:`MapValue`, its values in the input's declared
value type. Outputs have onnxruntime's layout for one map: one row, ``[1, n]``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from onnx2jax.ops.ml_common import ML
from onnx2jax.ops.registry import register

@dataclasses.dataclass(frozen=True)
class MapValue:
    """One map: its keys in the dict's order and its values as one numpy array of the declared type."""

    keys: tuple
    values: np.ndarray

    @classmethod
    def of(cls, mapping: Mapping[Any, Any], dtype: np.dtype | None) -> MapValue:
        """A dict given for a map input whose values have ``dtype`` (None: as numpy infers it)."""
        return cls(tuple(mapping), np.asarray(list(mapping.values()), dtype=dtype))


def _map(x: Any, op: str) -> MapValue:
    if isinstance(x, np.ndarray) and x.dtype == object and x.ndim == 0:
        x = x.item()  # a host step hands its inputs over through np.asarray
    if not isinstance(x, MapValue):
        raise TypeError(f"{op} takes a map (give a dict for the model's map input), got {type(x).__name__}")
    return x


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


@register("DictVectorizer", 1, domain=ML)
def dict_vectorizer(x, *, int64_vocabulary=None, string_vocabulary=None):
    # Column j holds the value of the vocabulary's j-th key, 0 where the map lacks it; other keys are ignored.
    x = _map(x, "DictVectorizer")
    vocabulary = [_text(k) for k in string_vocabulary] if string_vocabulary else [int(k) for k in int64_vocabulary or ()]
    if not vocabulary:
        raise ValueError("DictVectorizer needs int64_vocabulary or string_vocabulary")
    if x.values.dtype.kind not in "iuf":
        raise NotImplementedError(f"DictVectorizer of a map with {x.values.dtype} values (numeric values only)")
    column = {key: j for j, key in enumerate(vocabulary)}
    out = np.zeros((1, len(vocabulary)), x.values.dtype)
    for key, value in zip(x.keys, x.values):
        j = column.get(_text(key) if string_vocabulary else int(key))
        if j is not None:
            out[0, j] = value
    return out


_CAST_TO = {"TO_FLOAT": np.float32, "TO_INT64": np.int64}


@register("CastMap", 1, domain=ML)
def cast_map(x, *, cast_to, map_form, max_map):
    # DENSE: the values in increasing key order; SPARSE: position k holds key k's value, 0 elsewhere.
    x = _map(x, "CastMap")
    cast_to, map_form = _text(cast_to), _text(map_form)
    if cast_to not in _CAST_TO:
        raise NotImplementedError(f"CastMap cast_to={cast_to!r}: only {sorted(_CAST_TO)}")
    keys = np.asarray([int(k) for k in x.keys], np.int64)
    values = x.values.astype(np.float64).astype(_CAST_TO[cast_to])  # float to int64 truncates, as onnxruntime
    if map_form == "DENSE":
        return values[np.argsort(keys, kind="stable")][None, :]
    if map_form != "SPARSE":
        raise ValueError(f"CastMap map_form={map_form!r}: DENSE or SPARSE")
    outside = keys[(keys < 0) | (keys >= max_map)]
    if outside.size:
        raise ValueError(f"CastMap SPARSE: keys {outside.tolist()} outside [0, max_map={max_map})")
    out = np.zeros((1, int(max_map)), values.dtype)
    out[0, keys] = values
    return out
