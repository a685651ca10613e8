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
sub-axis (`onnx2jax.runtime.views`). Only other consumers see the fused ONNX
shape (a reshape XLA drops when nobody uses it). The collectives are then those
of the unfused model.

A Split or Slice whose pieces must come out whole along a sharded axis
gathers its input once before the cut (`ShardingHooks._gather_before_cut`).

A column-parallel MatMul (a replicated input times a weight whose output axis
is split over n devices) reads its input through one per-device stack of it,
[n, ...] split over the same devices and shared by every such reader of that
input (`ShardingHooks._column_parallel`). The forward is the same local product;
in the backward the readers' partial input gradients (q, k and v of a block)
add up locally in the stack and the stack's transpose, a sum over its sharded
axis, reduces them with one all-reduce where one per reader would follow each
product's sharded contraction otherwise. Each device's product is a plain 2-D
matmul of its stack entry by its weight columns (`jax.shard_map`): written as a
dot batched over the stack's axis, XLA on CPU copied every column weight,
transposed, on every call (98 MB of temporaries per device on a 336M Llama at
TP 8, 1 MB now).
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
from onnx2jax.runtime.views import View, run_on_views, view_of
from sharding.mesh.layout import expand_shape

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


def node_scope(name: str) -> str:
    """The named scope of an ONNX node in HLO metadata: its name, with ``/`` (a scope separator) escaped."""
    return "onnx:" + name.replace("/", "|")


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
        if not all(isinstance(d, int) for d in np.shape(x)):
            # A symbolic dimension (jax.export): jax 0.10.2 crashes (segfault in refine_polymorphic_shapes) calling
            # an exported shard_map, so the same product is written as a dot batched over the stack's axis.
            view = jnp.reshape(weight, (weight.shape[0], count, weight.shape[1] // count))
            view = jax.lax.with_sharding_constraint(view, NamedSharding(mesh, PartitionSpec(None, columns, None)))
            product = jnp.einsum("n...d,dnf->...nf", stack, view, precision=jax.lax.Precision.HIGHEST)
            return [jnp.reshape(product, (*x.shape[:-1], weight.shape[1]))]
        product = jax.shard_map(
            _local_product, mesh=mesh, in_specs=(PartitionSpec(columns), PartitionSpec(None, columns)),
            out_specs=PartitionSpec(columns),
        )(stack, weight)  # [n, ..., F/n]
        product = jnp.moveaxis(jnp.reshape(product, (count, *x.shape[:-1], weight.shape[1] // count)), 0, -2)
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
        """The node's outputs computed on unfused views, or None where it cannot be (`onnx2jax.runtime.views`)."""
        return run_on_views(node.op_type, inputs, views, attrs, compute, len(node.output))


def _local_product(stack: jax.Array, weight: jax.Array) -> jax.Array:
    """One device's columns: its copy of x ([1, ..., D]) times its [D, F/n] slice of the weight, a plain 2-D
    product (a dot batched over the stack's axis had XLA on CPU copy every column weight, transposed, on every
    call)."""
    return jnp.matmul(stack[0], weight, precision=jax.lax.Precision.HIGHEST)[None]


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
