"""Indexing: Gather, GatherElements, GatherND, Scatter*, TensorScatter, OneHot, Compress, NonZero, Trilu, ReverseSequence, Unique.

Negative indices count from the end of their axis, as ONNX specifies, so each
impl normalises them before indexing. Gathers work on numpy inputs too, so
that Shape -> Gather chains fold while tracing.

NonZero, Unique and Compress have output shapes that depend on their input
*values*. XLA needs shapes at compile time, so that input is declared static:
it works when known while tracing (a constant or a folded shape computation).
Anything else (a graph input, values computed at run time): the node runs on the host between jitted segments
(:mod:`sharding.segments`); the impls themselves refuse traced values with a
ValueError saying the output shape depends on them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax import symbolic
from onnx2jax.ops.registry import register


def _is_static(*values) -> bool:
    return all(v is None or isinstance(v, (np.ndarray, np.generic)) for v in values)


def _xp(*values):
    """numpy when every value is known while tracing, jax.numpy otherwise."""
    return np if _is_static(*values) else jnp


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _wrap(indices, dims):
    """Negative indices count from the end: -1 on a dim of 5 is 4 (on a symbolic dim, its runtime value)."""
    if symbolic.has_dims(dims if isinstance(dims, tuple) else (dims,)):
        bound = symbolic.as_jax(symbolic.value(dims)).astype(indices.dtype)
        return jnp.where(indices < 0, indices + bound, indices)
    xp = _xp(indices)
    return xp.where(indices < 0, indices + xp.asarray(dims, dtype=indices.dtype), indices)


def _runtime_shape_error(op: str, what: str) -> ValueError:
    return ValueError(
        f"{op}: the output shape depends on runtime values ({what}), which XLA cannot compile; "
        f"it works only when {what} is known while tracing (a constant or a folded shape computation)"
    )


def _element_index(indices, axis: int):
    """The full index of each element of ``indices`` when it addresses ``axis``.

    For indices of shape (2, 3) and axis 1, element [i, j] addresses
    data[i, indices[i, j]]: the index is (iota_0, indices).
    """
    grid = _sparse_grid(indices.shape)
    grid[axis] = indices
    return tuple(grid)


def _sparse_grid(shape) -> list:
    """``jnp.indices(shape, sparse=True)`` from ``broadcasted_iota``, which also takes the symbolic
    sizes of a shape under jax.export (``jnp.indices`` needs ints)."""
    rank = len(shape)
    return [
        jax.lax.broadcasted_iota(jnp.int32, tuple(d if j == i else 1 for j, d in enumerate(shape)), i)
        for i in range(rank)
    ]


_SCATTER = {
    "none": lambda ref, u: ref.set(u),
    "add": lambda ref, u: ref.add(u),
    "mul": lambda ref, u: ref.multiply(u),
    "max": lambda ref, u: ref.max(u),
    "min": lambda ref, u: ref.min(u),
}


def _scatter(data, index, updates, reduction: str):
    if reduction not in _SCATTER:
        raise ValueError(f"unsupported scatter reduction {reduction!r}")
    return _SCATTER[reduction](jnp.asarray(data).at[index], jnp.asarray(updates, dtype=data.dtype))


@register("Gather", 1, 11, 13)
def gather(x, indices, *, axis):
    axis = _axis(axis, x.ndim)
    indices = _wrap(indices, x.shape[axis])
    return _xp(x, indices).take(x, indices, axis=axis)


@register("GatherElements", 11, 13)
def gather_elements(x, indices, *, axis):
    axis = _axis(axis, x.ndim)
    indices = _wrap(indices, x.shape[axis])
    if _is_static(x, indices):
        grid = list(np.indices(indices.shape, sparse=True))
        grid[axis] = indices
        return x[tuple(grid)]
    return jnp.asarray(x)[_element_index(indices, axis)]


def _gather_nd(x, indices, batch_dims: int):
    # data (B, 4, 5), indices (B, 2, 1), batch_dims 1: for each batch b, the
    # 2 rows data[b, indices[b, i, 0]] -> output (B, 2, 5).
    b = int(batch_dims)
    k = indices.shape[-1]
    indices = _wrap(indices, x.shape[b : b + k])
    batch_shape = x.shape[:b]
    batch = int(np.prod(batch_shape, dtype=np.int64))
    flat_x = jnp.reshape(jnp.asarray(x), (batch, *x.shape[b:]))
    flat_i = jnp.reshape(jnp.asarray(indices), (batch, *indices.shape[b:]))
    picked = flat_x[(jnp.arange(batch).reshape((batch,) + (1,) * (flat_i.ndim - 2)),)
                    + tuple(flat_i[..., j] for j in range(k))]
    return jnp.reshape(picked, (*batch_shape, *indices.shape[b:-1], *x.shape[b + k :]))


@register("GatherND", 11)
def gather_nd_11(x, indices):
    return _gather_nd(x, indices, 0)


@register("GatherND", 12, 13)
def gather_nd(x, indices, *, batch_dims):
    return _gather_nd(x, indices, batch_dims)


@register("Scatter", 9, 11)
@register("ScatterElements", 11, 13)
def scatter_elements_11(data, indices, updates, *, axis):
    return scatter_elements(data, indices, updates, axis=axis, reduction="none")


@register("ScatterElements", 16, 18)
def scatter_elements(data, indices, updates, *, axis, reduction):
    axis = _axis(axis, data.ndim)
    indices = _wrap(jnp.asarray(indices), data.shape[axis])
    return _scatter(data, _element_index(indices, axis), updates, reduction)


@register("ScatterND", 11, 13)
def scatter_nd_11(data, indices, updates):
    return scatter_nd(data, indices, updates, reduction="none")


@register("ScatterND", 16, 18)
def scatter_nd(data, indices, updates, *, reduction):
    k = indices.shape[-1]
    indices = _wrap(jnp.asarray(indices), data.shape[:k])
    return _scatter(data, tuple(indices[..., j] for j in range(k)), updates, reduction)


@register("TensorScatter", 24)
def tensor_scatter(past_cache, update, write_indices=None, *, mode, axis):
    # Batch b writes update[b, ..., s, ...] at cache position write_indices[b] + s
    # along `axis` (modulo the cache length in "circular" mode).
    axis = _axis(axis, past_cache.ndim)
    if axis == 0:
        raise ValueError("TensorScatter: axis cannot be the batch axis 0")
    grid = _sparse_grid(update.shape)
    if write_indices is not None:
        start = jnp.reshape(jnp.asarray(write_indices), (-1,) + (1,) * (update.ndim - 1))
        grid[axis] = grid[axis] + start.astype(grid[axis].dtype)
    if mode == "circular":
        grid[axis] = grid[axis] % past_cache.shape[axis]
    elif mode != "linear":
        raise ValueError(f"unsupported TensorScatter mode {mode!r}")
    return jnp.asarray(past_cache).at[tuple(grid)].set(update, mode="drop")


def _one_hot(indices, depth, values, axis: int, wrap_negative: bool):
    depth = int(np.asarray(depth).reshape(()))
    rank = indices.ndim + 1
    axis = _axis(axis, rank)
    xp = _xp(indices, values)
    if not np.issubdtype(indices.dtype, np.integer):  # float indices are truncated
        indices = indices.astype(np.int64 if xp is np or jax.config.jax_enable_x64 else np.int32)
    if wrap_negative:
        indices = xp.where(indices < 0, indices + depth, indices)
    classes = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - 1 - axis))
    hot = xp.expand_dims(indices, axis) == classes
    return xp.where(hot, values[1], values[0])


@register("OneHot", 9, static_inputs=(1,))
def one_hot_9(indices, depth, values, *, axis):
    return _one_hot(indices, depth, values, axis, wrap_negative=False)


@register("OneHot", 11, 28, static_inputs=(1,))
def one_hot(indices, depth, values, *, axis):
    return _one_hot(indices, depth, values, axis, wrap_negative=True)


@register("Compress", 9, 11, 28, static_inputs=(1,))
def compress(x, condition, *, axis=None):
    if not _is_static(condition):
        raise _runtime_shape_error("Compress", "the condition input")
    keep = np.nonzero(np.asarray(condition).reshape(-1))[0]
    xp = _xp(x)
    if axis is None:
        return xp.take(xp.reshape(x, (-1,)), keep, axis=0)
    return xp.take(x, keep, axis=_axis(axis, x.ndim))


@register("NonZero", 9, 13, static_inputs=(0,))
def non_zero(x):
    if not _is_static(x):
        raise _runtime_shape_error("NonZero", "the input")
    return np.asarray(np.nonzero(np.atleast_1d(x)), dtype=np.int64).reshape(max(x.ndim, 1), -1)


@register("Trilu", 14)
def trilu(x, k=None, *, upper):
    xp = _xp(x, k)
    k = np.int64(0) if k is None else k
    rows = np.arange(x.shape[-2], dtype=np.int64)[:, None]
    cols = np.arange(x.shape[-1], dtype=np.int64)[None, :]
    keep = (cols - rows >= k) if upper else (cols - rows <= k)
    return xp.where(keep, x, xp.zeros((), dtype=x.dtype))


@register("ReverseSequence", 10, 28)
def reverse_sequence(x, sequence_lens, *, batch_axis, time_axis):
    # Position t of batch b reads t' = lens[b] - 1 - t when t < lens[b], else t.
    xp = _xp(x, sequence_lens)
    rank = x.ndim
    t_shape = [1] * rank
    t_shape[time_axis] = x.shape[time_axis]
    b_shape = [1] * rank
    b_shape[batch_axis] = x.shape[batch_axis]
    t = np.arange(x.shape[time_axis], dtype=np.int64).reshape(t_shape)
    lens = xp.reshape(sequence_lens.astype(np.int64), b_shape)
    source = xp.where(t < lens, lens - 1 - t, t)
    return xp.take_along_axis(x, xp.broadcast_to(source, x.shape), axis=time_axis)


@register("Unique", 11, 28, static_inputs=(0,))
def unique(x, *, axis=None, sorted):
    if not _is_static(x):
        raise _runtime_shape_error("Unique", "the input")
    x = np.asarray(x)
    y, first, inverse, counts = np.unique(
        x, return_index=True, return_inverse=True, return_counts=True, axis=axis
    )
    inverse = inverse.reshape(-1)
    if not sorted:
        # Reorder by first occurrence; `rank` maps a sorted position to its new one.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        y = np.take(y, order, axis=0 if axis is None else axis)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)
