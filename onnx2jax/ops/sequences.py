"""Sequence and optional ops.

While tracing, an ONNX sequence is a Python list of arrays and an empty optional
is ``None``; jax.jit passes both through as pytrees. Impls that produce a
sequence return it wrapped in a 1-tuple, because the translator reads a bare
list as several outputs. Positions are static inputs: a sequence's length is
always known while tracing.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _position(position, length: int, *, inserting: bool = False) -> int:
    index = int(np.asarray(position).reshape(()))
    high = length if inserting else length - 1
    if not -length <= index <= high:
        raise IndexError(f"sequence position {index} is out of range for a sequence of length {length}")
    return index + length if index < 0 else index


@register("SequenceConstruct", 11)
def sequence_construct(*inputs):
    return (list(inputs),)


@register("SequenceEmpty", 11)
def sequence_empty(*, dtype=None):
    return ([],)


@register("SequenceInsert", 11, static_inputs=(2,))
def sequence_insert(sequence, tensor, position=None):
    result = list(sequence)
    if position is None:
        result.append(tensor)
    else:
        result.insert(_position(position, len(result), inserting=True), tensor)
    return (result,)


@register("SequenceErase", 11, static_inputs=(1,))
def sequence_erase(sequence, position=None):
    result = list(sequence)
    del result[-1 if position is None else _position(position, len(result))]
    return (result,)


@register("SequenceAt", 11, static_inputs=(1,))
def sequence_at(sequence, position):
    return sequence[_position(position, len(sequence))]


@register("SequenceLength", 11)
def sequence_length(sequence):
    return np.asarray(len(sequence), np.int64)


@register("ConcatFromSequence", 11)
def concat_from_sequence(sequence, *, axis, new_axis):
    if not sequence:
        raise ValueError("ConcatFromSequence of an empty sequence has no defined dtype or shape")
    arrays = [jnp.asarray(t) for t in sequence]
    if new_axis:
        return jnp.stack(arrays, axis=axis)
    return jnp.concatenate(arrays, axis=axis)


@register("SplitToSequence", 11, 24, static_inputs=(1,))
def split_to_sequence(x, split=None, *, axis, keepdims):
    x = jnp.asarray(x)
    length = x.shape[axis]
    if split is None:
        parts = jnp.split(x, length, axis=axis)
        return ([jnp.squeeze(p, axis) for p in parts] if not keepdims else parts,)
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        sizes = [size] * (length // size) + ([length % size] if length % size else [])
    else:
        sizes = [int(s) for s in split]
        if sum(sizes) != length:
            raise ValueError(f"split sizes {sizes} do not add up to the axis length {length}")
    cuts = np.cumsum(sizes)[:-1].tolist()
    return (jnp.split(x, cuts, axis=axis),)


@register("SequenceMap", 17, context=True)
def sequence_map(ctx, sequence, *additional, body):
    outputs = [[] for _ in body.output]
    for i in range(len(sequence)):
        args = [sequence[i]] + [a[i] if isinstance(a, list) else a for a in additional]
        for acc, value in zip(outputs, ctx.run_graph(body, args)):
            acc.append(value)
    return tuple(outputs)


@register("Optional", 15, 28)
def optional(value=None, *, type=None):
    return (value,)


@register("OptionalGetElement", 15, 18, 28)
def optional_get_element(value):
    if value is None:
        raise ValueError("OptionalGetElement of an empty optional")
    return (value,)


@register("OptionalHasElement", 15, 18, 28)
def optional_has_element(value=None):
    return np.asarray(value is not None)
