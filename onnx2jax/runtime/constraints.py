"""Sharding constraints on node inputs and outputs, and unfused views of fused axes.

Every node input and output that carries a spec is passed through
``jax.lax.with_sharding_constraint`` with its NamedSharding (proposal 0007:
inputs are resharded to the specs written for them, outputs come out in
theirs).

A *fused* axis (several simple_shardings on one axis) is not a tile of the
ONNX tensor: device 0 of a [B, 2F] gate/up output split as
[{2, 1 shard}, {F, 2 shards}] holds columns [0, F/2) and [F, 3F/2). XLA can
only shard the unfused [B, 2, F] view. So a tensor with a fused spec is kept
alive in that view from its producer to its consumers, and every op whose
rule keeps the sharded sub-axis runs on it: elementwise ops (other operands
framed into the view: scalars, broadcast or replicated tensors), Transpose
(the sub-axes move together), MatMul by a weight whose output axis is fused,
a batched MatMul whose fused axis is a batch axis, Softmax, reductions and
Concat along other axes, Reshape, and Split/Slice at boundaries of the outermost
sub-axis. Only other consumers see the fused ONNX shape (a reshape XLA drops
when nobody uses it). The collectives are then those of the unfused model.

A Split or Slice whose pieces must come out whole along a sharded axis
gathers its input once before the cut (`ShardingHooks._gather_before_cut`).

A column-parallel MatMul (a replicated input times a weight whose output axis
is split over n devices) reads its input through one per-device stack of it,
[n, ...] split over the same devices and shared by every such reader of that
input (`ShardingHooks._column_parallel`). The forward is the same local product;
in the backward the readers' partial input gradients (q, k and v of a block)
add up locally in the stack and the stack's transpose, a sum over its sharded
axis, reduces them with one all-reduce where one per reader would follow each
product's sharded contraction otherwise.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import onnx
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.graph_runner import is_static
from onnx2jax.ops.conv import conv_by_groups
from sharding import op_facts
from sharding.mesh.layout import expand_shape

ELEMENTWISE = op_facts.ELEMENTWISE - {"CastLike"}  # CastLike's second input gives a type only: no frame
REDUCTIONS = op_facts.REDUCTIONS


# Normalisations whose statistics span the axes from ``axis`` on (Softmax: ``axis`` alone).
NORMALIZATIONS = frozenset({"Softmax", "LogSoftmax", "LayerNormalization", "RMSNormalization"})


class SpecKey(NamedTuple):
    """One node input or output that carries a spec."""

    node: str
    kind: str  # "in" or "out"
    position: int
    tensor: str

    def __str__(self) -> str:
        return f"node {self.node!r} {self.kind}put {self.position} ({self.tensor!r})"


@dataclasses.dataclass(frozen=True)
class Placement:
    """How one tensor is laid out on the mesh.

    ``fused`` lists the fused axes and their sub-axis sizes: the sharding
    applies to the tensor reshaped to its sub-axes.
    """

    sharding: NamedSharding
    fused: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def expand(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The unfused shape of a tensor of ONNX ``shape``."""
        return expand_shape(shape, self.fused)


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


def node_scope(name: str) -> str:
    """The named scope of an ONNX node in HLO metadata: its name, with ``/`` (a scope separator) escaped."""
    return "onnx:" + name.replace("/", "|")


def view_of(array: Any, shape: tuple[int, ...], placement: Placement) -> View:
    """``array`` (ONNX ``shape``) seen through a fused placement's expanded shape."""
    ((axis, sizes),) = placement.fused
    return View(jnp.reshape(array, placement.expand(shape)), tuple(shape), axis, len(sizes))


class ShardingHooks:
    """The translator hook (see ``onnx2jax.graph_runner.Hooks``) of one trace of a compiled model.

    Args:
      placements: by node input/output, where the value must live.
      views: tensors already held unfused (fused parameters, as stored);
        filled further as fused outputs are produced.
      copies: node inputs that read their own copy of a parameter, already
        placed as that input's spec asks (an array, or a View when fused).
    """

    def __init__(
        self,
        placements: Mapping[SpecKey, Placement],
        views: Mapping[str, View],
        copies: Mapping[SpecKey, Any] | None = None,
    ):
        self.placements = placements
        self.views = dict(views)
        self.copies = dict(copies or {})
        self.gathered: dict[tuple, Any] = {}
        self.stacks: dict[tuple[int, Any], tuple[Any, Any, Any]] = {}
        self.placed: dict[tuple[int, Placement], tuple[Any, Any, Any]] = {}

    def run_node(
        self, node: onnx.NodeProto, inputs: list, attrs: dict[str, Any], compute: Callable[[list], list]
    ) -> list:
        # The node's name in the HLO metadata (op_name), so that the report can name the node of
        # every collective the compiled program holds (`onnx2jax.runtime.collective_sources`).
        with jax.named_scope(node_scope(node.name)):
            return self._run_node(node, inputs, attrs, compute)

    def _run_node(
        self, node: onnx.NodeProto, inputs: list, attrs: dict[str, Any], compute: Callable[[list], list]
    ) -> list:
        inputs, views = list(inputs), []
        for i, name in enumerate(node.input):
            key = SpecKey(node.name, "in", i, name)
            copy = self.copies.get(key)
            if copy is None:
                inputs[i] = self._constrain(key, inputs[i])
                views.append(self.views.get(name) if name else None)
            else:  # placed for this input already; the tensor's own view is left alone
                inputs[i] = copy.fold() if isinstance(copy, View) else copy
                views.append(copy if isinstance(copy, View) else None)
        if node.op_type in ("Split", "Slice") and views and views[0] is None:
            inputs = self._gather_before_cut(node, inputs, attrs)
        if node.op_type in NORMALIZATIONS and views and views[0] is None:
            inputs = self._gather_before_norm(node, inputs, attrs)
        out_views = self._run_unfused(node, inputs, views, attrs, compute) if any(views) else None
        if out_views is None and node.op_type == "MatMul" and not any(views):
            out_views = self._column_parallel(node, inputs)
        if out_views is None and self._groups_split(node, inputs, attrs):
            outputs = [conv_by_groups(*inputs, **attrs)]
        elif out_views is None:
            outputs = compute(inputs)
        else:
            outputs = []
            for name, out in zip(node.output, out_views):
                if isinstance(out, View):
                    self.views[name] = out
                    out = out.fold()
                outputs.append(out)
        return [
            self._constrain(SpecKey(node.name, "out", i, name), v) for i, (name, v) in enumerate(zip(node.output, outputs))
        ]

    def _gather_before_cut(self, node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any]) -> list:
        """Split/Slice whose pieces come out whole along a sharded axis: gather the input once, first.

        Left to itself XLA cuts the sharded input and reshards every piece
        (collective-permutes and one all-gather per piece); a single
        all-gather before the cut, then local slicing, is the minimum.
        """
        source = self.placements.get(SpecKey(node.name, "in", 0, node.input[0]))
        if source is None or source.fused or not inputs or inputs[0] is None or is_static(inputs[0]):
            return inputs
        rank = len(np.shape(inputs[0]))
        axes = _cut_axes(node.op_type, inputs, attrs, rank)
        entries = list(source.sharding.spec) + [None] * (rank - len(source.sharding.spec))
        whole = set()
        for position, name in enumerate(node.output):
            placement = self.placements.get(SpecKey(node.name, "out", position, name))
            if placement is None or placement.fused:
                return inputs
            out = list(placement.sharding.spec) + [None] * (rank - len(placement.sharding.spec))
            whole |= {a for a in axes if entries[a] is not None and out[a] is None}
        if not whole:
            return inputs
        spec = PartitionSpec(*(None if a in whole else e for a, e in enumerate(entries)))
        key = (node.input[0], spec)  # several Slices of one tensor share one gather
        if key not in self.gathered:
            self.gathered[key] = jax.lax.with_sharding_constraint(inputs[0], NamedSharding(source.sharding.mesh, spec))
        return [self.gathered[key], *inputs[1:]]

    def _gather_before_norm(self, node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any]) -> list:
        """A normalisation over a sharded axis whose output has that axis whole: gather the input first.

        Left to itself XLA computes the statistics as partial sums (two
        all-reduces for LayerNorm's mean and variance, one for RMSNorm's or
        Softmax's) and then all-gathers the normalised output: the gather is
        paid anyway, so one all-gather of the input, then the norm run
        locally, is the minimum (`sharding.rules.normalization` states the
        choice). When the output keeps the axis sharded, the statistics'
        all-reduces ([..., 1] per row) are the cheaper way and nothing is
        gathered: that is what XLA does unaided.
        """
        source = self.placements.get(SpecKey(node.name, "in", 0, node.input[0]))
        out = self.placements.get(SpecKey(node.name, "out", 0, node.output[0]))
        if source is None or out is None or source.fused or out.fused or not inputs or inputs[0] is None:
            return inputs
        if is_static(inputs[0]):
            return inputs
        rank = len(np.shape(inputs[0]))
        entries = list(source.sharding.spec) + [None] * (rank - len(source.sharding.spec))
        outs = list(out.sharding.spec) + [None] * (rank - len(out.sharding.spec))
        whole = {a for a in _normalised_axes(node.op_type, attrs, rank) if entries[a] is not None and outs[a] is None}
        if not whole:
            return inputs
        spec = PartitionSpec(*(None if a in whole else e for a, e in enumerate(entries)))
        return [jax.lax.with_sharding_constraint(inputs[0], NamedSharding(source.sharding.mesh, spec)), *inputs[1:]]

    def _groups_split(self, node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any]) -> bool:
        """A grouped Conv with several channels per group whose input channels are split.

        XLA all-gathers such a convolution (docs/known-issues.md);
        `onnx2jax.ops.conv.conv_by_groups` computes it batched over the groups,
        which keeps each device on its own groups.
        """
        if node.op_type != "Conv" or int(attrs.get("group", 1)) <= 1 or len(inputs) < 2:
            return False
        if inputs[1] is None or np.ndim(inputs[1]) < 3 or np.shape(inputs[1])[1] <= 1:
            return False
        source = self.placements.get(SpecKey(node.name, "in", 0, node.input[0]))
        if source is None or source.fused:
            return False
        entries = tuple(source.sharding.spec)
        return len(entries) > 1 and entries[1] is not None

    def _column_parallel(self, node: onnx.NodeProto, inputs: list) -> list | None:
        """x @ W with x replicated and W [D, F] split along F over n devices: through x's shared [n, ...] stack.

        Each device multiplies its copy of x by its columns of W (viewed
        [D, n, F/n]), as the plain product would; only the backward differs
        (see the module docstring). None where the node is not such a product.
        """
        places = [self.placements.get(SpecKey(node.name, "in", i, name)) for i, name in enumerate(node.input)]
        out = self.placements.get(SpecKey(node.name, "out", 0, node.output[0]))
        if len(places) != 2 or None in places or out is None or any(p.fused for p in (*places, out)):
            return None
        x, weight = inputs
        if any(v is None or is_static(v) for v in inputs) or np.ndim(weight) != 2 or np.ndim(x) < 2:
            return None
        x_spec, w_spec, out_spec = (tuple(p.sharding.spec) for p in (*places, out))
        columns = w_spec[1] if len(w_spec) == 2 else None
        if any(e is not None for e in x_spec) or columns is None or w_spec[0] is not None:
            return None
        if len(out_spec) != np.ndim(x) or out_spec[-1] != columns or any(e is not None for e in out_spec[:-1]):
            return None
        mesh = places[1].sharding.mesh
        count = math.prod(mesh.shape[a] for a in (columns if isinstance(columns, tuple) else (columns,)))
        if weight.shape[1] % count:
            return None
        stack = _cached(self.stacks, (id(x), columns), x)
        if stack is None:
            stack = jnp.broadcast_to(x[None], (count, *x.shape))
            stack = jax.lax.with_sharding_constraint(stack, NamedSharding(mesh, PartitionSpec(columns)))
            _store(self.stacks, (id(x), columns), x, stack)
        view = jnp.reshape(weight, (weight.shape[0], count, weight.shape[1] // count))
        view = jax.lax.with_sharding_constraint(view, NamedSharding(mesh, PartitionSpec(None, columns, None)))
        product = jnp.einsum("n...d,dnf->...nf", stack, view, precision=jax.lax.Precision.HIGHEST)
        return [jnp.reshape(product, (*x.shape[:-1], weight.shape[1]))]

    def _constrain(self, key: SpecKey, value: Any) -> Any:
        """``value`` placed as ``key``'s spec asks.

        An unfused placement is applied once per value: the readers of one
        tensor that ask for the same placement (and its producer's output, when
        it asks the same) share one constraint, and so read one object (what
        `_column_parallel` shares its stack by). The forward is unchanged.
        """
        placement = self.placements.get(key)
        if placement is None or value is None or is_static(value) or isinstance(value, (list, tuple)):
            return value
        if not placement.fused:
            placed = _cached(self.placed, (id(value), placement), value)
            if placed is None:
                placed = jax.lax.with_sharding_constraint(value, placement.sharding)
                _store(self.placed, (id(value), placement), value, placed)
                _store(self.placed, (id(placed), placement), placed, placed)  # a reader of the placed output
            return placed
        if len(placement.fused) > 1:  # no unfused view to keep: constrain through a reshape
            expanded = jax.lax.with_sharding_constraint(jnp.reshape(value, placement.expand(value.shape)), placement.sharding)
            return jnp.reshape(expanded, value.shape)
        view = self.views.get(key.tensor)
        if view is None or tuple(view.array.shape) != placement.expand(tuple(value.shape)):
            view = view_of(value, tuple(value.shape), placement)
        view = dataclasses.replace(view, array=jax.lax.with_sharding_constraint(view.array, placement.sharding))
        self.views[key.tensor] = view
        return view.fold()

    def _run_unfused(self, node: onnx.NodeProto, inputs: list, views: list, attrs: dict[str, Any], compute) -> list | None:
        """The node's outputs computed on unfused views, or None where it cannot be."""
        op = node.op_type
        if op in ELEMENTWISE:
            return _elementwise(inputs, views, compute)
        if op == "Split":
            return _split(inputs, views, attrs, len(node.output))
        if op in ("MatMul", "Gemm"):
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


def _normalised_axes(op_type: str, attrs: Mapping[str, Any], rank: int) -> list[int]:
    """The axes a normalisation op reduces over (as `sharding.rules.normalization` reads them)."""
    if op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        return [int(attrs.get("axis", -1)) % rank]  # opset >= 13: the translator targets these
    return list(range(int(attrs.get("axis", -1)) % rank, rank))


def _cached(cache: dict, key: tuple, value: Any) -> Any | None:
    """What ``cache`` holds for ``value`` under ``key``, if made in the current trace.

    A scan or control-flow body is traced with the same hooks: what was made
    in one trace must not be read from another (a leaked tracer).
    """
    entry = cache.get(key)
    if entry is None or entry[0] is not value or entry[2] != jax.extend.core.get_opaque_trace_state():
        return None
    return entry[1]


def _store(cache: dict, key: tuple, value: Any, made: Any) -> None:
    """Remember ``made`` for ``value`` (kept alive by the entry, so that its id stays unique) in this trace."""
    cache[key] = (value, made, jax.extend.core.get_opaque_trace_state())


def _cut_axes(op_type: str, inputs: list, attrs: Mapping[str, Any], rank: int) -> set[int]:
    """The axes a Split or Slice cuts (a Slice with runtime axes: all of them)."""
    if op_type == "Split":
        return {int(attrs.get("axis", 0)) % rank}
    axes = inputs[3] if len(inputs) > 3 else None
    if axes is None and attrs.get("axes") is not None:  # opset < 10
        return {int(a) % rank for a in attrs["axes"]}
    if axes is None or not is_static(axes):
        return set(range(rank))
    return {int(a) % rank for a in np.asarray(axes).reshape(-1)}


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
    array = jnp.tensordot(x, weight.array, axes=([-1], [0]), precision=jax.lax.Precision.HIGHEST)
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
    new_shape = tuple(int(d) for d in _resolve_reshape(view.shape, np.asarray(target)))
    if not new_shape or new_shape[-1] != view.shape[-1]:
        return None
    subs = tuple(view.array.shape[view.axis :])
    return [View(jnp.reshape(view.array, new_shape[:-1] + subs), new_shape, len(new_shape) - 1, view.count)]


def _reshape_from_view(inputs: list, views: list) -> list | None:
    """Any other Reshape: from the unfused array straight to the target (the same data, row-major)."""
    view, target = views[0], inputs[1]
    if view is None or not is_static(target):
        return None
    return [jnp.reshape(view.array, tuple(int(d) for d in _resolve_reshape(view.shape, np.asarray(target))))]


def _resolve_reshape(shape: tuple[int, ...], target: np.ndarray) -> list[int]:
    """ONNX Reshape's 0 (copy) and -1 (infer) rules, without allowzero."""
    dims = [shape[i] if d == 0 else int(d) for i, d in enumerate(target)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(shape) // known if known else 0
    return dims


def _split_sizes(inputs: list, attrs: Mapping[str, Any], length: int, count: int) -> list[int] | None:
    if len(inputs) > 1 and inputs[1] is not None:
        return [int(s) for s in np.asarray(inputs[1])] if is_static(inputs[1]) else None
    if attrs.get("split"):
        return [int(s) for s in attrs["split"]]
    parts = attrs.get("num_outputs") or count
    block = -(-length // parts)
    return [min(block, length - i * block) for i in range(parts)]
