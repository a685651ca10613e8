"""Reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd, TopK."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
from onnx2jax.ops.softmax import stable_logsumexp

_KEEP = object()  # "reduce nothing": noop_with_empty_axes with no axes


def _axes_from_input(axes, noop_with_empty_axes):
    """Reduce-13/18 axes input (static) -> a tuple of axes, None (all axes) or _KEEP."""
    if axes is None or np.asarray(axes).size == 0:
        return _KEEP if noop_with_empty_axes else None
    return tuple(int(a) for a in np.asarray(axes).reshape(-1))


def _axes_from_attribute(axes):
    return None if axes is None or len(axes) == 0 else tuple(int(a) for a in axes)


def _normalize(x, axes):
    ndim = jnp.ndim(x)
    if axes is None:
        return tuple(range(ndim))
    return tuple(sorted({a + ndim if a < 0 else a for a in axes}))


def _wide_float():
    return jax.dtypes.canonicalize_dtype(jnp.float64)  # float32 when x64 is off


def _is_int(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.integer)


def _sum(x, axes, keepdims):
    return jnp.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _empty_fill(x, axes, keepdims, value):
    """The result of reducing an empty set: ``value`` with the reduced shape."""
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keepdims or i not in axes)
    return jnp.full(shape, value, x.dtype)


def _is_empty(x, axes) -> bool:
    return any(x.shape[a] == 0 for a in axes)


def _lowest(dtype):
    if dtype == jnp.bool_:
        return False
    return -jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min


def _highest(dtype):
    if dtype == jnp.bool_:
        return True
    return jnp.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).max


def _reduce_sum(x, axes, keepdims):
    return _sum(x, axes, keepdims)


def _reduce_sum_square(x, axes, keepdims):
    return _sum(x * x, axes, keepdims)


def _reduce_l1(x, axes, keepdims):
    return _sum(jnp.abs(x), axes, keepdims)


def _reduce_l2(x, axes, keepdims):
    if _is_int(x.dtype):
        wide = jnp.sum(jnp.square(x.astype(_wide_float())), axis=axes, keepdims=keepdims)
        return jnp.sqrt(wide).astype(x.dtype)
    return jnp.sqrt(_sum(x * x, axes, keepdims))


def _reduce_mean(x, axes, keepdims):
    if _is_empty(x, axes):
        return _empty_fill(x, axes, keepdims, jnp.nan)
    if _is_int(x.dtype):
        # numpy's mean with an integer dtype: integer sum, true division, truncation.
        count = int(np.prod([x.shape[a] for a in axes]))
        return (_sum(x, axes, keepdims) / count).astype(x.dtype)
    return jnp.mean(x, axis=axes, keepdims=keepdims).astype(x.dtype)


def _reduce_prod(x, axes, keepdims):
    return jnp.prod(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _reduce_max(x, axes, keepdims):
    if _is_empty(x, axes):
        return _empty_fill(x, axes, keepdims, _lowest(x.dtype))
    return jnp.max(x, axis=axes, keepdims=keepdims)


def _reduce_min(x, axes, keepdims):
    if _is_empty(x, axes):
        return _empty_fill(x, axes, keepdims, _highest(x.dtype))
    return jnp.min(x, axis=axes, keepdims=keepdims)


def _reduce_log_sum(x, axes, keepdims):
    return jnp.log(_sum(x, axes, keepdims))


def _reduce_log_sum_exp(x, axes, keepdims):
    if _is_empty(x, axes):
        return _empty_fill(x, axes, keepdims, -jnp.inf)
    if _is_int(x.dtype):
        out = stable_logsumexp(x.astype(_wide_float()), axes, keepdims)
        return out.astype(x.dtype)
    return stable_logsumexp(x, axes, keepdims).astype(x.dtype)


def _register_reduce(name, reduce, attribute_versions, input_versions):
    """Registers ``reduce(x, axes, keepdims)`` with axes as an attribute and as an input."""

    @register(name, *attribute_versions)
    def with_attribute(data, *, axes=None, keepdims):
        data = jnp.asarray(data)
        return reduce(data, _normalize(data, _axes_from_attribute(axes)), bool(keepdims))

    if input_versions:

        @register(name, *input_versions, static_inputs=(1,))
        def with_input(data, axes=None, *, keepdims, noop_with_empty_axes):
            data = jnp.asarray(data)
            axes = _axes_from_input(axes, noop_with_empty_axes)
            if axes is _KEEP:
                return data
            return reduce(data, _normalize(data, axes), bool(keepdims))

    return with_attribute


_register_reduce("ReduceSum", _reduce_sum, (1, 11), (13,))
_register_reduce("ReduceSumSquare", _reduce_sum_square, (1, 11, 13), (18,))
_register_reduce("ReduceL1", _reduce_l1, (1, 11, 13), (18,))
_register_reduce("ReduceL2", _reduce_l2, (1, 11, 13), (18,))
_register_reduce("ReduceMean", _reduce_mean, (1, 11, 13), (18,))
_register_reduce("ReduceProd", _reduce_prod, (1, 11, 13), (18,))
_register_reduce("ReduceMax", _reduce_max, (1, 11, 12, 13), (18, 20))
_register_reduce("ReduceMin", _reduce_min, (1, 11, 12, 13), (18, 20))
_register_reduce("ReduceLogSum", _reduce_log_sum, (1, 11, 13), (18, 28))
_register_reduce("ReduceLogSumExp", _reduce_log_sum_exp, (1, 11, 13), (18, 28))


def _arg_reduce(x, axis, keepdims, select_last_index, fn):
    x = jnp.asarray(x)
    axis = axis + x.ndim if axis < 0 else axis
    if select_last_index:
        # Search the reversed axis: the first hit there is the last one here.
        n = x.shape[axis]
        index = (n - 1) - fn(jnp.flip(x, axis), axis=axis, keepdims=bool(keepdims))
    else:
        index = fn(x, axis=axis, keepdims=bool(keepdims))
    return index.astype(jnp.int64)


@register("ArgMax", 1, 11, 12, 13)
def arg_max(data, *, axis, keepdims, select_last_index=0):
    return _arg_reduce(data, axis, keepdims, select_last_index, jnp.argmax)


@register("ArgMin", 1, 11, 12, 13)
def arg_min(data, *, axis, keepdims, select_last_index=0):
    return _arg_reduce(data, axis, keepdims, select_last_index, jnp.argmin)


def _scan_along(x, axis, exclusive, reverse, scan, identity):
    if reverse:
        x = jnp.flip(x, axis)
    out = scan(x, axis=axis, dtype=x.dtype)
    if exclusive:
        # Shift by one along the axis: [a, a+b, a+b+c] -> [0, a, a+b].
        pad = [(0, 0)] * x.ndim
        pad[axis] = (1, 0)
        out = jnp.pad(out, pad, constant_values=identity)
        out = jax.lax.slice_in_dim(out, 0, x.shape[axis], axis=axis)
    if reverse:
        out = jnp.flip(out, axis)
    return out


def _cumulative(x, axis, exclusive, reverse, scan, identity):
    x = jnp.asarray(x)
    if isinstance(axis, (np.ndarray, np.generic)):
        axis = int(np.asarray(axis).reshape(-1)[0])
        return _scan_along(x, axis + x.ndim if axis < 0 else axis, exclusive, reverse, scan, identity)
    # An axis known only at run time: every branch has x's shape, so switch over the axes.
    axis = jnp.reshape(axis, ()).astype(jnp.int32)
    branches = [
        (lambda v, a=a: _scan_along(v, a, exclusive, reverse, scan, identity)) for a in range(x.ndim)
    ]
    return jax.lax.switch(jnp.where(axis < 0, axis + x.ndim, axis), branches, x)


@register("CumSum", 11, 14)
def cum_sum(x, axis, *, exclusive, reverse):
    return _cumulative(x, axis, exclusive, reverse, jnp.cumsum, 0)


@register("CumProd", 26)
def cum_prod(x, axis, *, exclusive, reverse):
    return _cumulative(x, axis, exclusive, reverse, jnp.cumprod, 1)


def _top_k(x, k, axis, largest):
    x = jnp.asarray(x)
    axis = axis + x.ndim if axis < 0 else axis
    moved = jnp.moveaxis(x, axis, -1)
    if largest:
        key = moved
    elif jnp.issubdtype(x.dtype, jnp.integer):
        key = jnp.invert(moved)  # ~x reverses the order of any integer type without overflow
    else:
        key = -moved
    # lax.top_k is stable: among equal keys the lower index comes first, as ONNX requires.
    _, indices = jax.lax.top_k(key, k)
    values = jnp.take_along_axis(moved, indices, axis=-1)
    return jnp.moveaxis(values, -1, axis), jnp.moveaxis(indices.astype(jnp.int64), -1, axis)


@register("TopK", 1)
def top_k_1(x, *, k, axis):
    return _top_k(x, int(k), axis, True)


@register("TopK", 10, static_inputs=(1,))
def top_k_10(x, k, *, axis):
    return _top_k(x, int(np.asarray(k).reshape(-1)[0]), axis, True)


@register("TopK", 11, 24, static_inputs=(1,))
def top_k(x, k, *, axis, largest, sorted):  # noqa: A002 - ONNX name
    # sorted=0 leaves the order unspecified; a sorted result satisfies it.
    return _top_k(x, int(np.asarray(k).reshape(-1)[0]), axis, largest)
