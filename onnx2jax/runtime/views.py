"""Unfused views of fused axes, and the ops that run on them.

A *fused* axis (several simple_shardings on one axis) is not a tile of the ONNX tensor: XLA can only shard
its unfused view (a [B, 2F] gate/up output split as [{2, 1 shard}, {F, 2 shards}] is held [B, 2, F]).
`onnx2jax.runtime.constraints` keeps such a tensor in its :class:`View` from producer to consumers;
:func:`run_on_views` computes a consumer on the views when the op's rule keeps the sharded sub-axis
(elementwise ops, Transpose, MatMul/Gemm, Softmax, reductions, Concat, Reshape, Split and Slice at
sub-axis boundaries), so that the collectives are those of the unfused model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.graph_runner import is_static
from onnx2jax.ops.shapes import reshape_target
from onnx2jax.numerics import dot_precision
from sharding import op_facts

if TYPE_CHECKING:
    from onnx2jax.runtime.placement_keys import TensorPlacement

ELEMENTWISE = op_facts.ELEMENTWISE - {"CastLike"}  # CastLike's second input gives a type only: no frame
REDUCTIONS = op_facts.REDUCTIONS


@dataclasses.dataclass(frozen=True)
class View:
    """A tensor held unfused: ``array`` has the fused ONNX axis ``axis`` split into ``count`` sub-axes."""

    array: Any
    shape: tuple[int, ...]
    axis: int
    count: int

    def fold(self) -> Any:
        """The tensor in its ONNX shape."""
        return jnp.reshape(self.array, self.shape)

    def inner(self) -> int:
        """Elements of the fused axis per step of its outermost sub-axis."""
        return math.prod(self.array.shape[self.axis + 1 : self.axis + self.count])


def view_of(array: Any, shape: tuple[int, ...], placement: "TensorPlacement") -> View:
    """``array`` (ONNX ``shape``) seen through a fused placement's expanded shape."""
    ((axis, sizes),) = placement.fused
    return View(jnp.reshape(array, placement.expand(shape)), tuple(shape), axis, len(sizes))


def run_on_views(
    op_type: str, inputs: list, views: list, attrs: Mapping[str, Any], compute, outputs: int
) -> list | None:
    """A node's outputs computed on the unfused views of its inputs, or None where the op cannot run on them."""
    op = op_type
    if op in ELEMENTWISE:
        return _elementwise(inputs, views, compute)
    if op == "Split":
        return _split(inputs, views, attrs, outputs)
    if op in op_facts.LINEAR_PRODUCTS:
        return _product(op, inputs, views, attrs) or (_batched(inputs, views, compute) if op == "MatMul" else None)
    if op == "Reshape":
        return _reshape_leading(inputs, views) or _reshape_from_view(inputs, views)
    if op == "Transpose":
        return _transpose(views, attrs, compute)
    if op in ("Softmax", "LogSoftmax"):
        return _along_other_axis(views, attrs, compute)
    if op == "Slice":
        return _slice(inputs, views, compute)
    if op in REDUCTIONS:
        return _reduce(inputs, views, attrs, compute)
    if op == "Concat":
        return _concat(inputs, views, attrs, compute)
    return None


def _sub_sizes(view: View) -> tuple[int, ...]:
    return tuple(view.array.shape[view.axis : view.axis + view.count])


def _framed(value: Any, view: View) -> Any | None:
    """A tensor without a view, broadcast against ``view`` from the right, in the view's frame.

    Its axis facing the fused one must be 1 (it broadcasts: one 1 per
    sub-axis) or the fused size (a replicated tensor, reshaped to the
    sub-axes); an operand too short to reach the fused axis broadcasts as it is.
    """
    shape = tuple(np.shape(value))
    position = len(shape) - (len(view.shape) - view.axis)
    if position < 0:
        return value
    if shape[position] == 1:
        subs = (1,) * view.count
    elif shape[position] == view.shape[view.axis]:
        subs = _sub_sizes(view)
    else:
        return None
    new = shape[:position] + subs + shape[position + 1 :]
    return np.reshape(value, new) if is_static(value) else jnp.reshape(value, new)


def _common_frame(inputs: list, views: list) -> tuple[View, list, list] | None:
    """Every input in the frame of the first view: (that view, arguments, ONNX shapes), or None.

    Views must face each other (same position from the right, same sub-axes);
    other inputs are framed by `_framed`.
    """
    first = next(v for v in views if v is not None)
    from_right = len(first.shape) - first.axis
    args, shapes = [], []
    for value, view in zip(inputs, views):
        if view is not None:
            if len(view.shape) - view.axis != from_right or _sub_sizes(view) != _sub_sizes(first):
                return None
            args.append(view.array)
            shapes.append(view.shape)
        elif value is None:
            args.append(None)
        else:
            framed = _framed(value, first)
            if framed is None:
                return None
            args.append(framed)
            shapes.append(tuple(np.shape(value)))
    return first, args, shapes


def _elementwise(inputs: list, views: list, compute) -> list | None:
    """The op on the views; the other inputs broadcast into their frame (scalars, biases, replicated tensors)."""
    found = _common_frame(inputs, views)
    if found is None:
        return None
    first, args, shapes = found
    shape = tuple(np.broadcast_shapes(*shapes))
    from_right = len(first.shape) - first.axis
    return [View(out, shape, len(shape) - from_right, first.count) for out in compute(args)]


def _batched(inputs: list, views: list, compute) -> list | None:
    """A batched MatMul whose fused axis is a batch axis (Q·Kᵀ on [B*H, S, D]): batch axes broadcast."""
    first = next(v for v in views if v is not None)
    if len(first.shape) - first.axis <= 2 or any(np.ndim(x) < 2 for x in inputs):
        return None
    found = _common_frame(inputs, views)
    if found is None:
        return None
    _, args, shapes = found
    (out,) = compute(args)
    batch = tuple(np.broadcast_shapes(*(s[:-2] for s in shapes)))
    shape = batch + (shapes[0][-2], shapes[1][-1])
    return [View(out, shape, len(shape) - (len(first.shape) - first.axis), first.count)]


def _transpose(views: list, attrs: Mapping[str, Any], compute) -> list | None:
    """A Transpose moves the fused axis's sub-axes together."""
    view = views[0]
    rank = len(view.shape)
    perm = [int(p) % rank for p in (attrs.get("perm") or range(rank - 1, -1, -1))]
    starts = [a if a <= view.axis else a + view.count - 1 for a in range(rank)]
    widths = [view.count if a == view.axis else 1 for a in range(rank)]
    expanded = [starts[a] + k for a in perm for k in range(widths[a])]
    (out,) = compute([view.array], override={"perm": expanded})
    return [View(out, tuple(view.shape[a] for a in perm), perm.index(view.axis), view.count)]


def _along_other_axis(views: list, attrs: Mapping[str, Any], compute) -> list | None:
    """Softmax/LogSoftmax along an axis other than the fused one: the same axis in the view.

    Axes after the fused one shift by its extra sub-axes; whether the op
    normalises one axis (opset 13) or all axes from it on (earlier), the
    view's axes hold the same data.
    """
    view = views[0]
    rank = len(view.shape)
    axis = int(attrs["axis"]) % rank
    if axis == view.axis:
        return None
    moved = axis if axis < view.axis else axis + view.count - 1
    (out,) = compute([view.array], override={"axis": moved})
    return [View(out, view.shape, view.axis, view.count)]


def _split(inputs: list, views: list, attrs: Mapping[str, Any], count: int) -> list | None:
    """Split along the fused axis at boundaries of its outermost sub-axis: slices of the view."""
    view = views[0]
    if view is None or attrs.get("axis", 0) % len(view.shape) != view.axis:
        return None
    sizes = _split_sizes(inputs, attrs, view.shape[view.axis], count)
    inner = view.inner()
    if sizes is None or any(size % inner for size in sizes):
        return None
    outputs, start = [], 0
    for size in sizes:
        piece = jax.lax.slice_in_dim(view.array, start // inner, (start + size) // inner, axis=view.axis)
        shape = view.shape[: view.axis] + (size,) + view.shape[view.axis + 1 :]
        outputs.append(View(piece, shape, view.axis, view.count) if size // inner > 1 else jnp.reshape(piece, shape))
        start += size
    return outputs


def _slice(inputs: list, views: list, compute) -> list | None:
    """A Slice (opset >= 10, constant bounds) of a view: other axes renumbered, the fused axis cut
    at boundaries of its outermost sub-axis (a slice of that sub-axis: local, no collective)."""
    view = views[0]
    if view is None or len(inputs) < 3 or any(x is not None and not is_static(x) for x in inputs[1:]):
        return None
    rank = len(view.shape)
    starts, ends = np.asarray(inputs[1]).reshape(-1), np.asarray(inputs[2]).reshape(-1)
    axes = np.asarray(inputs[3]).reshape(-1) if len(inputs) > 3 and inputs[3] is not None else np.arange(len(starts))
    steps = np.asarray(inputs[4]).reshape(-1) if len(inputs) > 4 and inputs[4] is not None else np.ones(len(starts), np.int64)
    bounds, shape, outer = [], list(view.shape), None
    for axis, start, end, step in zip(axes, starts, ends, steps):
        axis, (first, stop, stride) = int(axis) % rank, slice(int(start), int(end), int(step)).indices(view.shape[int(axis) % rank])
        shape[axis] = len(range(first, stop, stride))
        if axis != view.axis:
            bounds.append((axis if axis < view.axis else axis + view.count - 1, int(start), int(end), int(step)))
            continue
        inner = view.inner()
        if stride != 1 or first % inner or stop % inner or stop <= first:
            return None
        outer = (stop - first) // inner
        bounds.append((axis, first // inner, stop // inner, 1))
    column = lambda i: np.asarray([b[i] for b in bounds], np.int64)  # noqa: E731
    (out,) = compute([view.array, column(1), column(2), column(0), column(3)])
    if outer == 1:
        return [jnp.reshape(out, tuple(shape))]
    return [View(out, tuple(shape), view.axis, view.count)]


def _concat(inputs: list, views: list, attrs: Mapping[str, Any], compute) -> list | None:
    """Concat along another axis than the fused one (a key cache along the sequence): in the view."""
    first = next(v for v in views if v is not None)
    rank = len(first.shape)
    axis = int(attrs["axis"]) % rank
    if axis == first.axis or any(
        x is not None and (np.ndim(x) != rank or np.shape(x)[first.axis] != first.shape[first.axis]) for x in inputs
    ):
        return None
    found = _common_frame(inputs, views)
    if found is None:
        return None
    _, args, shapes = found
    (out,) = compute(args, override={"axis": axis if axis < first.axis else axis + first.count - 1})
    shape = tuple(sum(s[a] for s in shapes) if a == axis else d for a, d in enumerate(first.shape))
    return [View(out, shape, first.axis, first.count)]


def _reduce(inputs: list, views: list, attrs: Mapping[str, Any], compute) -> list | None:
    """A reduction over axes other than the fused one (a manual softmax's max and sum): the same axes in the view."""
    view = views[0]
    rank = len(view.shape)
    given = inputs[1] if len(inputs) > 1 else None
    if given is not None and not is_static(given):
        return None
    axes = np.asarray(given).reshape(-1) if given is not None else attrs.get("axes")
    if axes is None or len(axes) == 0:
        return None  # all axes (or none, by noop_with_empty_axes): the fused one too
    axes = sorted({int(a) % rank for a in axes})
    if view.axis in axes:
        return None
    moved = [a if a < view.axis else a + view.count - 1 for a in axes]
    if given is not None:
        (out,) = compute([view.array, np.asarray(moved, np.int64)])
    else:
        (out,) = compute([view.array], override={"axes": moved})
    keep = attrs.get("keepdims", 1)
    shape = tuple(1 if a in axes else d for a, d in enumerate(view.shape)) if keep else tuple(
        d for a, d in enumerate(view.shape) if a not in axes
    )
    axis = view.axis if keep else view.axis - sum(a < view.axis for a in axes)
    return [View(out, shape, axis, view.count)]


def _product(op_type: str, inputs: list, views: list, attrs: Mapping[str, Any]) -> list | None:
    """x @ W (+ C) with W's output axis fused: contract with W's view, so the product comes out unfused."""
    weight = views[1] if len(views) > 1 else None
    if weight is None or views[0] is not None or weight.axis != 1 or len(weight.shape) != 2:
        return None
    if op_type == "Gemm" and (attrs.get("transA") or attrs.get("transB")):
        return None
    x = inputs[0]
    array = jnp.tensordot(x, weight.array, axes=([-1], [0]), precision=dot_precision(x, weight.array))
    if op_type == "Gemm":
        array = array * jnp.asarray(attrs.get("alpha", 1.0), array.dtype)
        bias = inputs[2] if len(inputs) > 2 else None
        if bias is not None:
            bias_view = views[2]
            if bias_view is not None and bias_view.array.shape == weight.array.shape[1:]:
                bias_array = bias_view.array
            elif np.size(bias) == 1:
                bias_array = jnp.reshape(bias, ())
            else:
                return None
            array = array + jnp.asarray(attrs.get("beta", 1.0), array.dtype) * bias_array
    shape = tuple(x.shape[:-1]) + (weight.shape[1],)
    return [View(array, shape, len(shape) - 1, weight.count)]


def _reshape_leading(inputs: list, views: list) -> list | None:
    """A Reshape that keeps the fused last axis and regroups only the leading axes."""
    view = views[0]
    target = inputs[1]
    if view is None or not is_static(target) or view.axis != len(view.shape) - 1:
        return None
    new_shape = reshape_target(view.shape, target, 0)
    if not new_shape or new_shape[-1] != view.shape[-1]:
        return None
    subs = tuple(view.array.shape[view.axis :])
    return [View(jnp.reshape(view.array, new_shape[:-1] + subs), new_shape, len(new_shape) - 1, view.count)]


def _reshape_from_view(inputs: list, views: list) -> list | None:
    """Any other Reshape: from the unfused array straight to the target (the same data, row-major)."""
    view, target = views[0], inputs[1]
    if view is None or not is_static(target):
        return None
    return [jnp.reshape(view.array, reshape_target(view.shape, target, 0))]




def _split_sizes(inputs: list, attrs: Mapping[str, Any], length: int, count: int) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(s) for s in np.asarray(inputs[1])] if is_static(inputs[1]) else None
    if attrs.get("split"):
        return [int(s) for s in attrs["split"]]
    parts = attrs.get("num_outputs") or count
    block = -(-length // parts)
    return [min(block, length - i * block) for i in range(parts)]
