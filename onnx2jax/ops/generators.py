"""Tensors made from attributes or shapes: Constant, ConstantOfShape, Range, EyeLike, Random*, Bernoulli, Multinomial.

Constant, ConstantOfShape, Range and EyeLike return numpy arrays: their values
are known while tracing, so they fold into shape computations; where a size
holds a symbolic dimension (``jax.export``), ConstantOfShape and Range return
jax arrays of that size (:mod:`onnx2jax.symbolic`).

Random ops draw from ``jax.random`` with a key made from the node's ``seed``
attribute, or from the fixed key 0 when it has none. The key is a constant of
the traced program, so a jitted model returns the same sample on every call
(ONNX leaves the values of unseeded random ops unspecified). The samples are
not the ones onnxruntime or numpy would draw; only shapes and dtypes match.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
from jax import lax

from onnx2jax import symbolic
from onnx2jax.ops.registry import register


def _np_dtype(onnx_dtype: int | None, default):
    if onnx_dtype is None or onnx_dtype == 0:
        return np.dtype(default)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(int(onnx_dtype)))


def _key(seed):
    """The PRNG key for a node: from its ``seed`` attribute, else the fixed key 0."""
    return jax.random.key(0 if seed is None else int(seed))


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    # indices are either flat (shape [nnz]) or coordinates (shape [nnz, rank]).
    values = onnx.numpy_helper.to_array(sparse.values)
    indices = onnx.numpy_helper.to_array(sparse.indices)
    shape = tuple(sparse.dims)
    dense = np.zeros(math.prod(shape), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(tuple(indices.T), shape)
    dense[flat] = values
    return dense.reshape(shape)


@register("Constant", 1, 9)
def constant_1(*, value):
    return np.asarray(value)


@register("Constant", 11, 12, 13, 19, 21, 23, 24, 25)
def constant(
    *,
    value=None,
    sparse_value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
    value_string=None,
    value_strings=None,
):
    if value is not None:
        return np.asarray(value)
    if sparse_value is not None:
        return _densify(sparse_value)
    if value_float is not None:
        return np.asarray(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.asarray(value_floats, dtype=np.float32).reshape(-1)
    if value_int is not None:
        return np.asarray(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.asarray(value_ints, dtype=np.int64).reshape(-1)
    if value_string is not None:
        return np.asarray(value_string, dtype=object)
    if value_strings is not None:
        return np.asarray(value_strings, dtype=object).reshape(-1)
    raise ValueError("Constant has none of the value attributes")


@register("ConstantOfShape", 9, 20, 21, 23, 24, 25, static_inputs=(0,))
def constant_of_shape(shape, *, value=None):
    fill = np.zeros((1,), np.float32) if value is None else np.asarray(value)
    dims = tuple(symbolic.dims(shape))
    xp = jnp if symbolic.has_dims(dims) else np  # a symbolic size (jax.export): only jax has that shape
    return xp.full(dims, fill.reshape(-1)[0], dtype=fill.dtype)


@register("Range", 11, static_inputs=(0, 1, 2))
def range_11(start, limit, delta):
    if any(symbolic.is_symbolic(v) for v in (start, limit, delta)):
        return _symbolic_range(start, limit, delta)
    start, limit, delta = (np.asarray(v) for v in (start, limit, delta))
    return np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)


def _symbolic_range(start, limit, delta):
    """Range whose bounds hold a symbolic dimension (jax.export): ``start + i * delta`` for i < its length,
    the length ``max(ceil((limit - start) / delta), 0)`` as a size jax can take."""
    start, limit, delta = (symbolic.dims(v)[0] for v in (start, limit, delta))
    if symbolic.is_dim(delta) or int(delta) == 0:
        raise ValueError(f"Range: delta {delta} must be a nonzero constant to size the output")
    count = (limit - start + delta - 1) // delta if delta > 0 else (start - limit - delta - 1) // -delta
    count = jax.core.max_dim(count, 0)
    dtype = jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
    return jnp.asarray(start).astype(dtype) + lax.iota(dtype, count) * delta


_STASH_DTYPES = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64}


@register("Range", 27, static_inputs=(0, 1, 2))
def range_(start, limit, delta, *, stash_type):
    # float16/bfloat16 ranges are computed in the stash type and cast back, so
    # that start + i * delta does not lose steps to rounding.
    start, limit, delta = (np.asarray(v) for v in (start, limit, delta))
    dtype = start.dtype
    if dtype.name in ("float16", "bfloat16") and stash_type is not None:
        compute = _STASH_DTYPES.get(int(stash_type))
        if compute is None:
            raise ValueError(f"Range: unsupported stash_type {stash_type}")
        return np.arange(
            start.astype(compute).item(), float(limit.item()), float(delta.item()), dtype=compute
        ).astype(dtype)
    return range_11(start, limit, delta)


@register("EyeLike", 9, 22)
def eye_like(x, *, dtype=None, k):
    if len(x.shape) != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {tuple(x.shape)}")
    rows, cols = x.shape
    return np.eye(rows, cols, k=int(k), dtype=_np_dtype(dtype, x.dtype))


def _normal(shape, dtype, mean, scale, seed):
    sample = jax.random.normal(_key(seed), tuple(int(d) for d in shape), dtype=jnp.float32 if dtype != np.float64 else dtype)
    return (sample * scale + mean).astype(dtype)


def _uniform(shape, dtype, low, high, seed):
    compute = jnp.float32 if dtype != np.float64 else dtype
    sample = jax.random.uniform(_key(seed), tuple(int(d) for d in shape), dtype=compute, minval=low, maxval=high)
    return sample.astype(dtype)


@register("RandomNormal", 1, 22)
def random_normal(*, shape, dtype, mean, scale, seed=None):
    return _normal(shape, _np_dtype(dtype, np.float32), mean, scale, seed)


@register("RandomUniform", 1, 22)
def random_uniform(*, shape, dtype, low, high, seed=None):
    return _uniform(shape, _np_dtype(dtype, np.float32), low, high, seed)


@register("RandomNormalLike", 1, 22)
def random_normal_like(x, *, dtype=None, mean, scale, seed=None):
    return _normal(x.shape, _np_dtype(dtype, x.dtype), mean, scale, seed)


@register("RandomUniformLike", 1, 22)
def random_uniform_like(x, *, dtype=None, low, high, seed=None):
    return _uniform(x.shape, _np_dtype(dtype, x.dtype), low, high, seed)


@register("Bernoulli", 15, 22)
def bernoulli(p, *, dtype=None, seed=None):
    draw = jax.random.uniform(_key(seed), p.shape, dtype=jnp.float32)
    return (draw < jnp.asarray(p, jnp.float32)).astype(_np_dtype(dtype, p.dtype))


@register("Multinomial", 7, 22)
def multinomial(logits, *, dtype, sample_size, seed=None):
    # logits (batch, classes) -> samples (batch, sample_size) of class indices.
    batch = logits.shape[0]
    draws = jax.random.categorical(_key(seed), jnp.asarray(logits), axis=-1, shape=(int(sample_size), batch))
    return draws.T.astype(_np_dtype(dtype, np.int32))
