"""Placing host arrays on devices slice by slice, straight from their memory maps.

:func:`place` puts a weight on a sharding, :func:`place_stacked` a stack of
layer weights (a scanned model's) without building the stack on the host:
each addressable device's slice is cut by ``jax.make_array_from_callback``,
so no whole-tensor host copy is made and a process of a multi-host run reads
only its own shards.
"""

from __future__ import annotations

import weakref
from typing import ContextManager, Sequence

import jax
import numpy as np

from onnx2jax.loading import (
    aligned_view,
    drop_pages,
    file_identity,
    freeze,
    read_only_buffer,
)
from onnx2jax.x64 import x64_scope

_COPIES: weakref.WeakValueDictionary[tuple, np.ndarray] = weakref.WeakValueDictionary()
"""The buffer of each slice of a mapped file copied for the devices (not contiguous, or padded), while a
device holds it (jax on CPU keeps the buffer, not the view). Placed again (a pipeline's stages each hold
GPT-2's tied embedding, split alike) the slice is the same buffer, which jax on CPU aliases again, so the
process holds one copy of it."""


def place(array: np.ndarray, sharding: jax.sharding.Sharding, shape: tuple[int, ...] | None = None) -> jax.Array:
    """``array`` on ``sharding``, each device's slice read straight from ``array`` (a memory map).

    No whole-array host copy: each addressable device's slice is cut from
    ``array`` (zero-padded where ``shape``, the held shape, is larger) by
    ``jax.make_array_from_callback``, so a process of a multi-host run reads
    only its own shards. A slice that is not a contiguous, aligned, read-only
    view is copied once into such a buffer, which jax on CPU holds without
    copying again; devices that hold the same slice share it. The file's pages
    are dropped from memory afterwards (:func:`onnx2jax.loading.drop_pages`).
    """
    shape = tuple(array.shape) if shape is None else tuple(shape)
    made: dict[tuple, np.ndarray] = {}
    source = file_identity(array)

    def slice_of(index: tuple) -> np.ndarray:
        bounds = tuple(i.indices(n)[:2] for i, n in zip(index, shape))
        found = made.get(bounds)
        shared = None if source is None else (source, bounds, shape)
        held = None if shared is None else _COPIES.get(shared)
        if found is None and held is not None:
            found = freeze(aligned_view(held, tuple(b - a for a, b in bounds), array.dtype))
        if found is None:
            inside = tuple(slice(min(a, n), min(b, n)) for (a, b), n in zip(bounds, array.shape))
            part = array[inside] if inside else np.asarray(array)
            want = tuple(b - a for a, b in bounds)
            if part.shape == want and _holdable(part):
                found = part
            else:
                found = read_only_buffer(want, array.dtype)
                if part.shape != want:
                    found[...] = 0
                found[tuple(slice(0, n) for n in part.shape)] = part
                freeze(found)
                if shared is not None:
                    _COPIES[shared] = found.base
            made[bounds] = found
        return found

    with holding(array.dtype):
        result = jax.make_array_from_callback(shape, sharding, slice_of)
    drop_pages(array)
    return result


def place_stacked(layers: Sequence[np.ndarray], sharding: jax.sharding.Sharding) -> jax.Array:
    """``np.stack(layers)`` on ``sharding`` without the stacked host copy.

    Each device's slice of the stack is built from the layers' slices (memory
    maps) into one aligned read-only buffer, which jax on CPU holds as the
    device's copy; the layers' file pages are dropped afterwards. The per-layer
    and the stacked weights are never both in memory.
    """
    first = layers[0]
    shape = (len(layers), *first.shape)
    made: dict[tuple, np.ndarray] = {}

    def slice_of(index: tuple) -> np.ndarray:
        bounds = tuple(i.indices(n)[:2] for i, n in zip(index, shape))
        found = made.get(bounds)
        if found is None:
            (a, b), rest = bounds[0], tuple(slice(lo, hi) for lo, hi in bounds[1:])
            found = read_only_buffer((b - a, *(hi - lo for lo, hi in bounds[1:])), first.dtype)
            for k in range(a, b):
                found[k - a] = layers[k][rest]
            made[bounds] = freeze(found)
        return found

    with holding(first.dtype):
        result = jax.make_array_from_callback(shape, sharding, slice_of)
    for layer in layers:
        drop_pages(layer)
    return result


def holding(dtype: np.dtype) -> ContextManager:
    """:func:`onnx2jax.x64.x64_scope` for placing an array of ``dtype``: 64-bit stays 64-bit.

    Outside x64, ``device_put`` of a float64 weight gives a float32 array: a
    float64 model would then compute with rounded weights while its inputs and
    outputs stay float64, silently.
    """
    dtype = np.dtype(dtype)
    return x64_scope(dtype.itemsize == 8 and dtype.kind in "iuf" or dtype == np.complex128)


def _holdable(part: np.ndarray) -> bool:
    """Whether jax on CPU can hold ``part`` as it is (contiguous, 64-byte aligned, read-only)."""
    return part.flags.c_contiguous and not part.flags.writeable and part.ctypes.data % 64 == 0


def stack_on_host(layers: Sequence[np.ndarray]) -> np.ndarray:
    """``np.stack(layers)`` into one aligned read-only buffer, each layer's file pages dropped once copied."""
    stacked = read_only_buffer((len(layers), *layers[0].shape), layers[0].dtype)
    for k, layer in enumerate(layers):
        stacked[k] = layer
        drop_pages(layer)
    return freeze(stacked)


__all__ = ["holding", "place", "place_stacked", "stack_on_host"]
