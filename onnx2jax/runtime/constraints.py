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

A column-parallel MatMul or Gemm (a replicated input times a weight whose
output axis is split over n devices) reads its input through a per-device
stack [n, ...] split over the same devices, shared by every such product
whose input fans out from the same tensor (`onnx2jax.runtime.stacks`). The
forward is the same local product; in the backward the readers' partial
input gradients (q, k and v of a block; GPT-NeoX's attention and MLP, through
their LayerNorms) add up locally in the stack and its transpose reduces them
with one all-reduce, where one per reader would follow each product's sharded
contraction otherwise. Row-parallel products whose outputs are added (a sum
tree: GPT-NeoX's attn + mlp + x) add their partial sums first and reduce
once (`onnx2jax.runtime.partial_sums`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.graph_runner import is_static
from onnx2jax.ops.conv import conv_by_groups
from onnx2jax.runtime.partial_sums import PartialSumHooks
from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement, node_scope
from onnx2jax.runtime.stacks import StackHooks, cached, store
from onnx2jax.runtime.views import View, run_on_views, view_of
from sharding import op_facts

# Normalisations whose statistics span the axes from ``axis`` on (Softmax: ``axis`` alone).
NORMALIZATIONS = op_facts.SOFTMAXES | op_facts.ONNX_LAYER_NORMS


class ShardingHooks(StackHooks, PartialSumHooks):
    """The translator hook (see ``onnx2jax.graph_runner.Hooks``) of one trace of a compiled model.

    Args:
      placements: by node input/output, where the value must live.
      views: tensors already held unfused (fused parameters, as stored);
        filled further as fused outputs are produced.
      copies: node inputs that read their own copy of a parameter, already
        placed as that input's spec asks (an array, or a View when fused).
      graph, params: the traced graph and the values of its initializers, for
        planning where column-parallel products take their stacks
        (`onnx2jax.runtime.stacks`); without them each product stacks its own input.
    """

    def __init__(
        self,
        placements: Mapping[SpecKey, TensorPlacement],
        views: Mapping[str, View],
        copies: Mapping[SpecKey, Any] | None = None,
        graph: onnx.GraphProto | None = None,
        params: Mapping[str, Any] | None = None,
    ):
        self.placements = placements
        self.mesh = next((p.sharding.mesh for p in placements.values()), None)
        self.views = dict(views)
        self.copies = dict(copies or {})
        self.gathered: dict[tuple, Any] = {}
        self.placed: dict[tuple[int, TensorPlacement], tuple[Any, Any, Any]] = {}
        self._init_stacks(graph, placements, params)
        self._init_partial_sums(graph, placements)

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
        if out_views is None and node.op_type in op_facts.LINEAR_PRODUCTS and not any(views):
            out_views = self._column_parallel(node, inputs, attrs)
        partial = self._add_partials(node, inputs) if out_views is None and node.name in self.merging else None
        if partial is not None:
            outputs = [partial[3]]
        elif out_views is None and self._groups_split(node, inputs, attrs):
            outputs = [conv_by_groups(*inputs, **attrs)]
        elif out_views is None:
            outputs = compute(inputs)
        else:
            outputs = []
            for name, out in zip(node.output, out_views):
                if isinstance(out, View):
                    out = dataclasses.replace(out, array=self._unit_axes_whole(out.array))
                    self.views[name] = out
                    out = out.fold()
                outputs.append(out)
        outputs = [
            self._constrain(SpecKey(node.name, "out", i, name), v) for i, (name, v) in enumerate(zip(node.output, outputs))
        ]
        self._record(node, inputs, outputs, compute if out_views is None else None)
        self._record_partial(node, inputs, attrs, outputs, partial)
        return outputs

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
            placed = cached(self.placed, (id(value), placement), value)
            if placed is None:
                placed = jax.lax.with_sharding_constraint(value, placement.sharding)
                self.sources[id(placed)] = (value, placed)
                store(self.placed, (id(value), placement), value, placed)
                store(self.placed, (id(placed), placement), placed, placed)  # a reader of the placed output
            return placed
        if len(placement.fused) > 1:  # no unfused view to keep: constrain through a reshape
            expanded = jax.lax.with_sharding_constraint(jnp.reshape(value, placement.expand(value.shape)), placement.sharding)
            return jnp.reshape(expanded, value.shape)
        view = self.views.get(key.tensor)
        if view is None or tuple(view.array.shape) != placement.expand(tuple(value.shape)):
            view = view_of(self._unit_axes_whole(value), tuple(value.shape), placement)
        view = dataclasses.replace(view, array=jax.lax.with_sharding_constraint(view.array, placement.sharding))
        self.views[key.tensor] = view
        return view.fold()

    def _unit_axes_whole(self, array: Any) -> Any:
        """``array`` with no mesh axis on its size-1 axes, the others left to XLA, before it is reshaped.

        XLA's SPMD partitioner recurses without end (a segfault) on a reshape whose operand has a size-1
        axis split over a mesh axis while another axis is split too (a slice of a view taking one element
        of a split sub-axis; docs/known-issues.md). A size-1 axis cut k ways has its element on one device
        of k: releasing it costs at most that one element's broadcast.
        """
        shape = tuple(np.shape(array))
        if self.mesh is None or is_static(array) or 1 not in shape or len(shape) < 2:
            return array
        spec = PartitionSpec(*(None if d == 1 else PartitionSpec.UNCONSTRAINED for d in shape))
        return jax.lax.with_sharding_constraint(array, NamedSharding(self.mesh, spec))

    def _run_unfused(self, node: onnx.NodeProto, inputs: list, views: list, attrs: dict[str, Any], compute) -> list | None:
        """The node's outputs computed on unfused views, or None where it cannot be (`onnx2jax.runtime.views`)."""
        return run_on_views(node.op_type, inputs, views, attrs, compute, len(node.output))


def _normalised_axes(op_type: str, attrs: Mapping[str, Any], rank: int) -> list[int]:
    """The axes a normalisation op reduces over (as `sharding.rules.normalization` reads them)."""
    if op_type in ("Softmax", "LogSoftmax", "Hardmax"):
        return [int(attrs.get("axis", -1)) % rank]  # opset >= 13: the translator targets these
    return list(range(int(attrs.get("axis", -1)) % rank, rank))


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
