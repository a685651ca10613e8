"""Row-parallel products whose outputs are added: their partial sums added first, reduced once.

A row-parallel product (x's last axis and W's input axis split over n
devices, output replicated) is a sum of n per-device partial products: one
all-reduce each. Where such outputs meet in a sum tree (each inner value read
once, by the next Add: GPT-NeoX's attn + bias + mlp + bias + x), the
partials [n, ...] are added locally and the tree's root reduces them once,
in the forward; in the backward the reduction's transpose is a local
broadcast. Elsewhere each product keeps its own all-reduce
(`merging_adds`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.graph_runner import is_static
from onnx2jax.runtime.placement_keys import SpecKey, node_scope
from onnx2jax.runtime.stacks import (
    gemm_terms,
    node_keys,
    product_layout,
    product_operands,
    replicated,
    cached,
    store,
)
from onnx2jax.numerics import dot_precision


def row_parallel_partials(
    node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any], placements: Mapping[Any, Any]
) -> tuple[Any, Any] | None:
    """A row-parallel MatMul or Gemm as (partial products [n, ...] split over n devices, replicated addend).

    x's last axis and W's input axis are split over the same n devices and
    the output is replicated: the output is the partials' sum over their
    first axis (one all-reduce) plus the addend (Gemm's bias, or None). None
    where the node is not such a product.
    """
    places = {(kind, i, t): placements.get(SpecKey(node.name, kind, i, t)) for kind, i, t in node_keys(node)}
    rows = _rows(node, lambda kind, i, t: places.get((kind, i, t)))
    operands = None if rows is None else product_operands(node, inputs, attrs)
    if operands is None or len(tuple(places[("in", 0, node.input[0])].sharding.spec)) != np.ndim(operands[0]):
        return None
    x, weight = operands
    mesh = places[("in", 1, node.input[1])].sharding.mesh
    count = math.prod(mesh.shape[a] for a in (rows if isinstance(rows, tuple) else (rows,)))
    depth = weight.shape[0]
    if depth % count or x.shape[-1] != depth:
        return None
    lead = (None,) * (np.ndim(x) - 1)
    x_view = jnp.reshape(x, (*x.shape[:-1], count, depth // count))
    x_view = jax.lax.with_sharding_constraint(x_view, NamedSharding(mesh, PartitionSpec(*lead, rows, None)))
    w_view = jnp.reshape(weight, (count, depth // count, weight.shape[1]))
    w_view = jax.lax.with_sharding_constraint(w_view, NamedSharding(mesh, PartitionSpec(rows)))
    partials = jnp.einsum("...nd,ndf->n...f", x_view, w_view, precision=dot_precision(x_view, w_view))
    return gemm_terms(
        node, inputs, attrs, jax.lax.with_sharding_constraint(partials, NamedSharding(mesh, PartitionSpec(rows)))
    )


def _rows(node: onnx.NodeProto, place: Callable) -> Any:
    """The mesh axes a row-parallel product's contraction is split over (output replicated), or None."""
    layout = product_layout(node, place)
    if layout is None or (
        node.op_type == "Gemm"
        and len(node.input) > 2
        and node.input[2]
        and not replicated(place("in", 2, node.input[2]))
    ):
        return None
    x, (rows, columns), out = layout
    x_spec = tuple(x.sharding.spec)
    if rows is None or columns is not None or not replicated(out):
        return None
    if not x_spec or x_spec[-1] != rows or any(e is not None for e in x_spec[:-1]):
        return None
    return rows


def row_parallel(node: onnx.NodeProto, placements: Mapping[Any, Any]) -> bool:
    """Whether ``placements`` make ``node`` a row-parallel product (see `row_parallel_partials`)."""
    return _rows(node, lambda kind, i, t: placements.get(SpecKey(node.name, kind, i, t))) is not None


def merging_adds(graph: onnx.GraphProto, placements: Mapping[Any, Any], readers: Mapping[str, int]) -> set[str]:
    """The Adds (replicated output) of sum trees that add two or more row-parallel products' outputs.

    A tree's inner values (products, biases added to them, partial totals)
    have one reader each: the next Add. Adding the products' partial sums
    there and reducing once at the tree's root serves them all (GPT-NeoX:
    attn + bias, mlp + bias, their sum, + x). Elsewhere each product keeps
    its own all-reduce.
    """
    products: dict[str, int] = {}
    inner: dict[str, list[str]] = {}
    adds = {}
    for node in graph.node:
        if not node.output or not node.output[0]:
            continue
        out = node.output[0]
        if row_parallel(node, placements):
            products[out] = 1
        elif node.op_type == "Add" and len(node.input) == 2:
            if not replicated(placements.get(SpecKey(node.name, "out", 0, out))):
                continue
            summed = [i for i in node.input if products.get(i) and readers.get(i) == 1]
            if summed:
                products[out] = sum(products[i] for i in summed)
                inner[out] = [i for i in summed if i in adds]
                adds[out] = node.name
    merging: set[str] = set()
    todo = [out for out in adds if products[out] >= 2]
    while todo:
        out = todo.pop()
        if adds[out] not in merging:
            merging.add(adds[out])
            todo.extend(inner[out])
    return merging


def tensor_readers(graph: onnx.GraphProto) -> dict[str, int]:
    """How many node inputs and graph outputs read each tensor."""
    counts: dict[str, int] = {}
    for name in [i for node in graph.node for i in node.input] + [o.name for o in graph.output]:
        counts[name] = counts.get(name, 0) + 1
    return counts


class PartialSumHooks:
    """The partial sums' part of `onnx2jax.runtime.constraints.ShardingHooks` (a mixin: it uses the hooks' ``placements``)."""

    def _init_partial_sums(self, graph: onnx.GraphProto | None, placements: Mapping[Any, Any]) -> None:
        self.row_products = {n.name for n in graph.node if row_parallel(n, placements)} if graph is not None else set()
        self.partials: dict[tuple[int], tuple] = {}
        self.readers_of = tensor_readers(graph) if graph is not None else {}
        self.merging = merging_adds(graph, placements, self.readers_of) if graph is not None else set()

    def _record_partial(
        self, node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any], outputs: list, partial: tuple | None
    ) -> None:
        """Remembers a sum tree's value as its partials, and a row-parallel product's operands (partials made on demand)."""
        if partial is not None:
            store(self.partials, (id(outputs[0]),), outputs[0], partial[:3])
        elif node.name in self.row_products and len(outputs) == 1:
            store(self.partials, (id(outputs[0]),), outputs[0], (node, inputs, attrs))

    def _partials(self, value: Any) -> tuple[Any, Any, tuple[str, ...]] | None:
        """``value`` as (partial sums [n, ...] split over n devices, replicated addend or None, the products summed),
        if it is a pending sum."""
        entry = cached(self.partials, (id(value),), value)
        if entry is None or not isinstance(entry[0], onnx.NodeProto):  # a sum, or not yet made from its product
            return entry
        found = row_parallel_partials(*entry, self.placements)
        found = None if found is None else (*found, (entry[0].name,))
        store(self.partials, (id(value),), value, found)
        return found

    def _add_partials(self, node: onnx.NodeProto, inputs: list) -> tuple[Any, Any, Any, Any] | None:
        """An Add of a sum tree (`merging_adds`): (partials, addend, products, value).

        Two products' partial sums are added before they are reduced, so
        that one all-reduce serves both (GPT-NeoX's parallel residual,
        attn + mlp + x); a replicated term joins the addend. The value is
        the reduced sum; None where no input is a pending sum.
        """
        out = self.placements.get(SpecKey(node.name, "out", 0, node.output[0]))
        if out is None or out.fused or any(e is not None for e in out.sharding.spec) or len(inputs) != 2:
            return None
        if any(v is None or is_static(v) for v in inputs):
            return None
        # A pending sum read elsewhere too is reduced there anyway: adding its partials here would reduce them twice.
        terms = [self._partials(v) if self.readers_of.get(name) == 1 else None for name, v in zip(node.input, inputs)]
        stacks = [t[0] for t in terms if t is not None]
        if not stacks or any(s.shape != stacks[0].shape for s in stacks):
            return None
        if tuple(jnp.broadcast_shapes(*(np.shape(v) for v in inputs))) != tuple(stacks[0].shape[1:]):  # jnp: symbolic dims too
            return None
        addends = [t[1] for t in terms if t is not None and t[1] is not None]
        addends += [v for v, t in zip(inputs, terms) if t is None]
        partials = stacks[0] if len(stacks) == 1 else stacks[0] + stacks[1]
        addend = None if not addends else addends[0] if len(addends) == 1 else addends[0] + addends[1]
        products = tuple(p for t in terms if t is not None for p in t[2])
        with jax.named_scope(node_scope(products[0])):  # the all-reduce of the first product, as inference predicts
            value = jnp.sum(partials, axis=0)
        value = value if addend is None else value + addend
        return partials, addend, products, value.astype(jnp.result_type(*inputs))
