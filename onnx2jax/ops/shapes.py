"""Shape and layout ops: Reshape, Transpose, Squeeze/Unsqueeze, Flatten, Shape, Size, Expand, Tile, Concat, Split, Slice, Pad, DepthToSpace, SpaceToDepth, CenterCropPad, Identity.

Every impl works on numpy arrays as well as jax arrays: when all its inputs
are static (known while tracing), it computes with numpy so that shape chains
(Shape -> Gather -> Unsqueeze -> Concat -> Reshape) fold into constants, and
string tensors, which JAX cannot hold, still flow through them.
Shape-setting inputs (a Reshape's shape, a Slice's starts...) are declared
``static_inputs`` and read with numpy.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx2jax import symbolic
from onnx2jax.ops import _slices
from onnx2jax.ops.registry import register


def _is_static(*values) -> bool:
    return all(v is None or isinstance(v, (np.ndarray, np.generic)) for v in values)


def _xp(*values):
    """numpy when every value is known while tracing, jax.numpy otherwise."""
    return np if _is_static(*values) else jnp


def _ints(values) -> list:
    """A static input's values: ints, or jax's symbolic dimensions where a shape under jax.export holds them."""
    return symbolic.dims(values)


def _xp_to(x, shape):
    """numpy and ``x`` where the result of shape ``shape`` can be a numpy array; jax.numpy and ``x`` as jax
    where ``shape`` holds a symbolic dimension (no numpy array has that shape)."""
    if not symbolic.has_dims(shape):
        return _xp(x), x
    return jnp, symbolic.as_jax(x) if symbolic.is_symbolic(x) else x


def _axis(axis: int, rank: int) -> int:
    axis = int(axis)
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def reshape_target(in_shape, shape, allowzero: int) -> tuple:
    """ONNX Reshape's target: 0 copies the input's size (unless ``allowzero``), -1 takes the rest.

    Sizes may be jax's symbolic dimensions (jax.export): a 0 or -1 is always a constant.
    """
    # Worked example: in_shape (2, 3, 4), shape [0, -1], allowzero 0
    # -> 0 copies in_shape[0] = 2, then -1 takes 24 / 2 = 12: (2, 12).
    out = _ints(shape)
    if not allowzero:
        out = [in_shape[i] if _is_zero(s) else s for i, s in enumerate(out)]
    if sum(map(_is_minus_one, out)) > 1:
        raise ValueError(f"reshape target {out} has more than one -1")
    if any(map(_is_minus_one, out)):
        known = math.prod(s for s in out if not _is_minus_one(s))
        size = math.prod(in_shape)
        out[next(i for i, s in enumerate(out) if _is_minus_one(s))] = size // known if not _is_zero(known) else 0
    return tuple(out)


def _is_minus_one(size) -> bool:
    return not symbolic.is_dim(size) and size == -1


def _is_zero(size) -> bool:
    return not symbolic.is_dim(size) and size == 0


def _slice_index(shape, starts, ends, axes, steps) -> tuple[slice, ...]:
    # ONNX clamps like numpy but reads negative ends as "from the end" (never
    # "before index 0"), so a step -1 slice down to the first element has end
    # INT64_MIN or -dim-1; both clamp to -1, which becomes slice(s, None, -1).
    rank = len(shape)
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else [_axis(a, rank) for a in _ints(axes)]
    steps = [1] * len(starts) if steps is None else _ints(steps)
    index = [slice(None)] * rank
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim = shape[axis]
        if step == 0:
            raise ValueError("Slice step cannot be 0")
        if symbolic.has_dims((dim, start, end)):
            index[axis] = _symbolic_slice(dim, start, end, step, axis)
            continue
        if start < 0:
            start += dim
        if end < 0:
            end += dim
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            index[axis] = slice(start, end, step)
        elif dim == 0:
            index[axis] = slice(0, 0, 1)
        else:
            start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
            index[axis] = slice(start, None if end < 0 else end, step)
    return tuple(index)


_WHOLE = 2**62  # an end at least this large is "to the end" (torch writes INT64_MAX)


def _symbolic_slice(dim, start, end, step: int, axis: int) -> slice:
    """A step-1 slice where the axis size or a bound holds a symbolic dimension (jax.export).

    The clamping that ONNX asks for is decided where jax can decide it (``0``
    and ``INT64_MAX`` against ``batch``), with ``min``/``max`` of dimensions
    otherwise; a negative bound counts from the end.
    """
    if step != 1:
        raise ValueError(f"a Slice of step {step} on axis {axis} of size {dim} (symbolic) is not supported")

    def clamp(bound):
        if not symbolic.is_dim(bound) and bound >= _WHOLE:
            return dim
        if not symbolic.is_dim(bound) and bound < 0:
            bound = bound + dim
        return jax.core.min_dim(jax.core.max_dim(bound, 0), dim)

    return slice(clamp(start), clamp(end), 1)


def _pad(x, pads, mode: str, value, axes):
    rank = x.ndim
    pads = _ints(pads)
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in _ints(axes)]
    if len(pads) != 2 * len(axes):
        raise ValueError(f"pads has {len(pads)} values, expected 2 x {len(axes)} axes")
    width = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        width[axis] = (pads[i], pads[len(axes) + i])
    xp = _xp(x, value)
    if mode == "constant":
        # A scalar by the spec, but ONNX's own function bodies pass shape (1,).
        value = np.zeros((), x.dtype) if value is None else xp.reshape(value, ())
        if xp is np:
            crop = tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0)) for a, (lo, hi) in enumerate(width))
            grow = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
            return np.pad(x[crop], grow, mode="constant", constant_values=np.asarray(value).astype(x.dtype))
        # lax.pad takes negative widths as cropping.
        return lax.pad(x, jnp.asarray(value).astype(x.dtype), [(lo, hi, 0) for lo, hi in width])
    numpy_mode = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}.get(mode)
    if numpy_mode is None:
        raise ValueError(f"unsupported Pad mode {mode!r}")
    crop = tuple(slice(max(-lo, 0), x.shape[a] - max(-hi, 0)) for a, (lo, hi) in enumerate(width))
    grow = [(max(lo, 0), max(hi, 0)) for lo, hi in width]
    return xp.pad(x[crop], grow, mode=numpy_mode)


@register("Reshape", 1)
def reshape_1(x, *, shape, consumed_inputs=None):
    return _reshaped(x, reshape_target(x.shape, shape, 0))


@register("Reshape", 5, 13, static_inputs=(1,))
def reshape_5(x, shape):
    return _reshaped(x, reshape_target(x.shape, shape, 0))


@register("Reshape", 14, 19, 21, 23, 24, 25, static_inputs=(1,))
def reshape(x, shape, *, allowzero):
    return _reshaped(x, reshape_target(x.shape, shape, allowzero))


def _reshaped(x, target):
    xp, x = _xp_to(x, target)
    return xp.reshape(x, target)


@register("Transpose", 1, 13, 21, 23, 24, 25)
def transpose(x, *, perm=None):
    return _xp(x).transpose(x, None if perm is None else tuple(int(p) for p in perm))


@register("Squeeze", 1, 11)
def squeeze_1(x, *, axes=None):
    return squeeze(x, None if axes is None else np.asarray(axes))


@register("Squeeze", 13, 21, 23, 24, 25, static_inputs=(1,))
def squeeze(x, axes=None):
    if axes is None:
        if symbolic.has_dims(x.shape):
            raise ValueError(f"Squeeze without axes on shape {tuple(x.shape)}: whether a symbolic size is 1 "
                             "depends on its value; onnx2jax does not guess it")
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = tuple(_axis(a, x.ndim) for a in _ints(axes))
    return _xp(x).squeeze(x, axis=axes)


@register("Unsqueeze", 1, 11)
def unsqueeze_1(x, *, axes):
    return unsqueeze(x, np.asarray(axes))


@register("Unsqueeze", 13, 21, 23, 24, 25, static_inputs=(1,))
def unsqueeze(x, axes):
    # Axes index the output: x (3, 4) with axes [0, -1] -> rank 4 -> (1, 3, 4, 1).
    rank = x.ndim + len(_ints(axes))
    axes = sorted(_axis(a, rank) for a in _ints(axes))
    if len(set(axes)) != len(axes):
        raise ValueError(f"Unsqueeze axes {axes} repeat")
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return _xp(x).reshape(x, tuple(shape))


@register("Flatten", 1, 9, 11, 13, 21, 23, 24, 25)
def flatten(x, *, axis):
    axis = int(axis) + x.ndim if axis < 0 else int(axis)
    if not 0 <= axis <= x.ndim:
        raise ValueError(f"Flatten axis {axis} is out of range for rank {x.ndim}")
    shape = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))
    return _xp(x).reshape(x, shape)


@register("Shape", 1, 13)
def shape_1(x):
    return symbolic.value(tuple(x.shape))


@register("Shape", 15, 19, 21, 23, 24, 25)
def shape(x, *, start, end=None):
    rank = len(x.shape)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = rank if end is None else end
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return symbolic.value(tuple(x.shape[start:end]))


@register("Size", 1, 13, 19, 21, 23, 24, 25)
def size(x):
    return symbolic.value(math.prod(x.shape))


@register("Expand", 8, 13, static_inputs=(1,))
def expand(x, shape):
    target = tuple(_ints(shape))
    if symbolic.has_dims(target) or symbolic.has_dims(x.shape):
        out = symbolic.broadcast_shapes(tuple(x.shape), target)
    else:
        out = np.broadcast_shapes(tuple(x.shape), target)
    xp, x = _xp_to(x, out)
    return xp.broadcast_to(x, out)


@register("Tile", 1, static_inputs=(1, 2))
def tile_1(x, tiles, axis):
    reps = [1] * x.ndim
    reps[_axis(int(np.asarray(axis)), x.ndim)] = int(np.asarray(tiles))
    return _xp(x).tile(x, reps)


@register("Tile", 6, 13, static_inputs=(1,))
def tile(x, repeats):
    return _xp(x).tile(x, tuple(_ints(repeats)))


@register("Concat", 1, 4, 11, 13)
def concat(*inputs, axis=1):
    axis = _axis(axis, inputs[0].ndim)
    if _is_static(*inputs):
        return np.concatenate(inputs, axis=axis)
    return jnp.concatenate(inputs, axis=axis)


def _split(x, sizes: list[int], axis: int):
    axis = _axis(axis, x.ndim)
    if sum(sizes) != x.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not add up to dimension {x.shape[axis]} of axis {axis}")
    offsets = np.cumsum([0, *sizes])
    index = [slice(None)] * x.ndim
    outputs = []
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        index[axis] = slice(int(lo), int(hi))
        outputs.append(_slices.take(x, index))
    return tuple(outputs)


def _equal_sizes(dim: int, count: int) -> list[int]:
    # Opset 18: 7 split into 3 -> chunks of ceil(7 / 3) = 3: [3, 3, 1].
    chunk = -(-dim // count)
    sizes = [chunk] * (count - 1)
    return [*sizes, dim - sum(sizes)]


@register("Split", 1, context=True, static_inputs=(1,))
def split_1(ctx, x, split_input=None, *, axis=0, split=None):
    if split_input is not None:
        split = split_input
    return split_2(ctx, x, axis=axis, split=split)


@register("Split", 2, 11, context=True)
def split_2(ctx, x, *, axis, split=None):
    sizes = _ints(split) if split is not None and len(split) else _equal_sizes(x.shape[_axis(axis, x.ndim)], ctx.output_count)
    return _split(x, sizes, axis)


@register("Split", 13, context=True, static_inputs=(1,))
def split_13(ctx, x, split=None, *, axis):
    return split_2(ctx, x, axis=axis, split=split)


@register("Split", 18, context=True, static_inputs=(1,))
def split_18(ctx, x, split=None, *, axis, num_outputs=None):
    if split is not None:
        return _split(x, _ints(split), axis)
    count = ctx.output_count if num_outputs is None else int(num_outputs)
    return _split(x, _equal_sizes(x.shape[_axis(axis, x.ndim)], count), axis)


@register("Slice", 1)
def slice_1(x, *, starts, ends, axes=None):
    return _slices.take(x, _slice_index(x.shape, starts, ends, axes, None))


@register("Slice", 10, 11, 13, static_inputs=(1, 2, 3, 4))
def slice_(x, starts, ends, axes=None, steps=None):
    return _slices.take(x, _slice_index(x.shape, starts, ends, axes, steps))


@register("Pad", 1)
def pad_1(x, *, paddings, mode, value):
    return _pad(x, paddings, mode, np.asarray(value), None)


@register("Pad", 2)
def pad_2(x, *, pads, mode, value):
    return _pad(x, pads, mode, np.asarray(value), None)


@register("Pad", 11, 13, 18, 19, 21, 23, 24, 25, static_inputs=(1, 3))
def pad(x, pads, constant_value=None, axes=None, *, mode):
    return _pad(x, pads, mode, constant_value, axes)


@register("DepthToSpace", 1)
def depth_to_space_1(x, *, blocksize):
    return depth_to_space(x, blocksize=blocksize, mode="DCR")


@register("DepthToSpace", 11, 13, 28)
def depth_to_space(x, *, blocksize, mode):
    xp = _xp(x)
    b, c, h, w = x.shape
    n = int(blocksize)
    if mode == "DCR":
        tmp = xp.reshape(x, (b, n, n, c // (n * n), h, w)).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        tmp = xp.reshape(x, (b, c // (n * n), n, n, h, w)).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise ValueError(f"unsupported DepthToSpace mode {mode!r}")
    return xp.reshape(tmp, (b, c // (n * n), h * n, w * n))


@register("SpaceToDepth", 1, 13)
def space_to_depth_1(x, *, blocksize):
    return space_to_depth(x, blocksize=blocksize, mode="DCR")


@register("SpaceToDepth", 28)
def space_to_depth(x, *, blocksize, mode):
    xp = _xp(x)
    b, c, h, w = x.shape
    n = int(blocksize)
    tmp = xp.reshape(x, (b, c, h // n, n, w // n, n))
    if mode == "DCR":
        tmp = tmp.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        tmp = tmp.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise ValueError(f"unsupported SpaceToDepth mode {mode!r}")
    return xp.reshape(tmp, (b, c * n * n, h // n, w // n))


@register("CenterCropPad", 18, static_inputs=(1,))
def center_crop_pad(x, shape, *, axes=None):
    # A dim of 7 cropped to 4 keeps [1, 5) (the extra element goes to the
    # end); a dim of 4 padded to 7 gets 1 zero before and 2 after.
    axes = list(range(x.ndim)) if axes is None else [_axis(a, x.ndim) for a in axes]
    crop = [slice(None)] * x.ndim
    grow = [(0, 0)] * x.ndim
    for axis, target in zip(axes, _ints(shape)):
        dim = x.shape[axis]
        if target < dim:
            lo = (dim - target) // 2
            crop[axis] = slice(lo, lo + target)
        elif target > dim:
            lo = (target - dim) // 2
            grow[axis] = (lo, target - dim - lo)
    return _xp(x).pad(x[tuple(crop)], grow)


@register("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25, host_values=True)
def identity(x):
    # A tuple, so that a sequence (a list) stays one output.
    return (x,)
