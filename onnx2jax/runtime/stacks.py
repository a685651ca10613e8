"""Column-parallel products read through per-device stacks: one backward reduction per fan-out point.

A column-parallel product (x @ W, x replicated, W's output axis split over n
devices; MatMul, or Gemm) reads x through a stack [n, ...] split over the
same devices: each device multiplies its own copy of x by its columns, the
plain product. Only the backward differs: the partial input gradients of
every reader of one stack add up locally in it, and the stack's transpose (a
sum over its sharded axis) reduces them with one all-reduce, where one per
reader would follow each product's sharded contraction otherwise.

The stack is taken where the readers' inputs fan out, not at each input
(`plan_readers`): walking back from a product's input through replicated
nodes that read one activation (normalisations, elementwise ops, reshapes;
their other inputs are parameters or constants), the products whose walks
meet share the stack of their meeting point, and the nodes between it and
each product run on the stack too (vmapped over its axis, each device on
its own copy: the work of the replicated node). GPT-NeoX's parallel
residual, x + attn(ln1(x)) + mlp(ln2(x)), thus reduces x's gradient once
per block instead of once per LayerNorm. The parameters those nodes read
(the LayerNorms' scales and biases) are stacked in the same array as x,
flattened and concatenated, so that the gradients they get from the
readers' partial sums join that one reduction rather than adding one
reduction each.

Everything falls back to the stack of the product's own input (still
correct, with more reductions) where the trace does not match the plan: a
node not run through the hooks, a value placed differently for a reader
than for its producer, a parameter of another dtype.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import onnx
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.graph_runner import is_static
from onnx2jax.ops.registry import ops_with

# Nodes a walk from a product's input goes back through (besides the normalisations), given one activation input.
_PASSABLE = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Flatten"})
_NORMS = frozenset({"LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization"})
# Outputs known while tracing whatever the inputs (they read shapes only).
_SHAPE_READERS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})


@dataclasses.dataclass(frozen=True)
class Reader:
    """How one column-parallel product reads its input.

    ``leaf``: the tensor whose stack it reads; ``chain``: the nodes between
    ``leaf`` and the product's input, in run order (each reads the previous
    one's output at position ``position``); ``bundle``: the parameters
    stacked with ``leaf``, each with the node input that reads it.
    """

    leaf: str
    columns: Any
    chain: tuple[tuple[str, int], ...]
    bundle: tuple[tuple[str, str, int], ...]


def plan_readers(graph: onnx.GraphProto, placements: Mapping[Any, Any], params: Mapping[str, Any]) -> dict[str, Reader]:
    """By product node name: where each column-parallel product of ``graph`` takes its stack.

    ``placements`` is keyed by SpecKey (node, kind, position, tensor); a
    tensor is an activation when it depends on a graph input other than
    through its shape.
    """
    from onnx2jax.runtime.constraints import SpecKey

    producers = {out: node for node in graph.node for out in node.output if out}
    dynamic = _dynamic(graph, params)
    passable = ops_with(lambda f: f.elementwise, domain="") | _NORMS | _PASSABLE

    def place(node: onnx.NodeProto, kind: str, position: int, tensor: str):
        return placements.get(SpecKey(node.name, kind, position, tensor))

    def step(tensor: str) -> tuple[onnx.NodeProto, int] | None:
        node = producers.get(tensor)
        if node is None or node.op_type not in passable or len([o for o in node.output if o]) != 1:
            return None
        active = [i for i, name in enumerate(node.input) if name in dynamic]
        if len(active) != 1:
            return None
        keys = [("in", i, n) for i, n in enumerate(node.input) if n] + [("out", 0, node.output[0])]
        if not all(_replicated(place(node, *k)) for k in keys):
            return None
        return node, active[0]

    paths: dict[str, tuple[Any, list[tuple[str, tuple[onnx.NodeProto, int] | None]]]] = {}
    for node in graph.node:
        columns = _columns(node, lambda kind, i, t, node=node: place(node, kind, i, t))
        if columns is None:
            continue
        path, tensor, seen = [], node.input[0], set()
        while tensor not in seen:
            seen.add(tensor)
            back = step(tensor)
            path.append((tensor, back))
            if back is None:
                break
            tensor = back[0].input[back[1]]
        paths[node.name] = (columns, path)
    groups: dict[tuple, list[str]] = {}
    for name, (columns, path) in paths.items():
        groups.setdefault((path[-1][0], str(columns)), []).append(name)
    readers = {}
    for members in groups.values():
        tensors = [[t for t, _ in paths[m][1]] for m in members]
        leaf = next(t for t in tensors[0] if all(t in others for others in tensors))
        chains = {}
        for member in members:
            path = paths[member][1]
            upto = [t for t, _ in path].index(leaf)
            chains[member] = tuple((back[0].name, back[1]) for _, back in reversed(path[:upto]))
        bundle, nodes = [], {n.name: n for n in graph.node}
        for member in members:
            for node_name, active in chains[member]:
                node = nodes[node_name]
                for i, name in enumerate(node.input):
                    if i != active and name in params and name not in {b[0] for b in bundle}:
                        bundle.append((name, node_name, i))
        for member in members:
            readers[member] = Reader(leaf, paths[member][0], chains[member], tuple(bundle))
    return readers


def column_parallel(
    node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any], placements: Mapping[Any, Any], stack: Callable
) -> list | None:
    """The output of a column-parallel MatMul or Gemm computed from ``stack(x, count, columns, mesh)``.

    Each device multiplies its copy of x by its columns of W (viewed
    [D, n, F/n]), as the plain product would. None where the node is not
    such a product.
    """
    from onnx2jax.runtime.constraints import SpecKey

    places = {(kind, i, t): placements.get(SpecKey(node.name, kind, i, t)) for kind, i, t in _keys(node)}
    columns = _columns(node, lambda kind, i, t: places.get((kind, i, t)))
    if columns is None or any(v is None or is_static(v) for v in inputs[:2]):
        return None
    x, weight = inputs[0], inputs[1]
    if node.op_type == "Gemm":
        if int(attrs.get("transA", 0)) or np.ndim(x) != 2:
            return None
        weight = weight.T if int(attrs.get("transB", 0)) else weight
    if np.ndim(weight) != 2 or np.ndim(x) < 2:
        return None
    mesh = places[("in", 1, node.input[1])].sharding.mesh
    count = math.prod(mesh.shape[a] for a in (columns if isinstance(columns, tuple) else (columns,)))
    if weight.shape[1] % count:
        return None
    stacked = stack(x, count, columns, mesh)
    view = jnp.reshape(weight, (weight.shape[0], count, weight.shape[1] // count))
    view = jax.lax.with_sharding_constraint(view, NamedSharding(mesh, PartitionSpec(None, columns, None)))
    product = jnp.einsum("n...d,dnf->...nf", stacked, view, precision=jax.lax.Precision.HIGHEST)
    product = jnp.reshape(product, (*x.shape[:-1], weight.shape[1]))
    if node.op_type != "Gemm":
        return [product]
    dtype = x.dtype
    if float(attrs.get("alpha", 1.0)) != 1.0:
        product = product * jnp.asarray(attrs["alpha"], dtype)
    if len(inputs) > 2 and inputs[2] is not None:
        bias, beta = jnp.asarray(inputs[2]), float(attrs.get("beta", 1.0))
        product = product + (bias if beta == 1.0 else bias * jnp.asarray(beta, dtype))
    return [product.astype(dtype)]


def stack_of(values: list, count: int, columns: Any, mesh: jax.sharding.Mesh) -> list:
    """Each of ``values`` as a stack [count, ...] split over ``columns``, all sliced from one stacked array.

    One array, so that the stacks' gradients are reduced by one collective.
    """
    flat = jnp.concatenate([jnp.reshape(v, (-1,)) for v in values]) if len(values) > 1 else jnp.reshape(values[0], (-1,))
    stacked = jnp.broadcast_to(flat[None], (count, flat.shape[0]))
    stacked = jax.lax.with_sharding_constraint(stacked, NamedSharding(mesh, PartitionSpec(columns)))
    out, offset = [], 0
    for value in values:
        size = math.prod(np.shape(value))
        out.append(jnp.reshape(stacked[:, offset:offset + size], (count, *np.shape(value))))
        offset += size
    return out


def on_stack(compute: Callable[[list], list], inputs: list, stacked: Mapping[int, Any], sharding: NamedSharding) -> Any:
    """A node's single output computed on each device's copy: ``compute`` vmapped over the ``stacked`` inputs."""
    positions = sorted(stacked)

    def one(*values):
        args = list(inputs)
        for position, value in zip(positions, values):
            args[position] = value
        return compute(args)[0]

    return jax.lax.with_sharding_constraint(jax.vmap(one)(*(stacked[p] for p in positions)), sharding)


def _keys(node: onnx.NodeProto) -> list[tuple[str, int, str]]:
    return [("in", i, n) for i, n in enumerate(node.input) if n] + [("out", i, n) for i, n in enumerate(node.output) if n]


def _columns(node: onnx.NodeProto, place: Callable) -> Any:
    """The mesh axes a column-parallel product's output columns are split over, or None where it is not one."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or not node.output:
        return None
    x, weight, out = (place(k, i, t) for k, i, t in (("in", 0, node.input[0]), ("in", 1, node.input[1]), ("out", 0, node.output[0])))
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
        bias = place("in", 2, node.input[2])
        if bias is not None and bias.fused:
            return None
    if None in (x, weight, out) or any(p.fused for p in (x, weight, out)):
        return None
    w_spec = tuple(weight.sharding.spec) + (None,) * (2 - len(tuple(weight.sharding.spec)))
    if len(w_spec) != 2:
        return None
    if node.op_type == "Gemm":
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if int(attrs.get("transA", 0)):
            return None
        if int(attrs.get("transB", 0)):
            w_spec = w_spec[::-1]
    columns = w_spec[1]
    out_spec = tuple(out.sharding.spec)
    if any(e is not None for e in x.sharding.spec) or columns is None or w_spec[0] is not None:
        return None
    if not out_spec or out_spec[-1] != columns or any(e is not None for e in out_spec[:-1]):
        return None
    return columns


def _replicated(placement: Any) -> bool:
    return placement is None or (not placement.fused and all(e is None for e in placement.sharding.spec))


def _dynamic(graph: onnx.GraphProto, params: Mapping[str, Any]) -> set[str]:
    """The tensors that depend on a graph input other than through its shape (activations)."""
    fixed = {t.name for t in graph.initializer} | set(params)
    dynamic = {i.name for i in graph.input if i.name not in fixed}
    for node in graph.node:
        if node.op_type in _SHAPE_READERS:
            continue
        if node.attribute and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            dynamic.update(o for o in node.output if o)
        elif any(name in dynamic for name in node.input):
            dynamic.update(o for o in node.output if o)
    return dynamic


def row_parallel_partials(
    node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any], placements: Mapping[Any, Any]
) -> tuple[Any, Any] | None:
    """A row-parallel MatMul or Gemm as (partial products [n, ...] split over n devices, replicated addend).

    x's last axis and W's input axis are split over the same n devices and
    the output is replicated: the output is the partials' sum over their
    first axis (one all-reduce) plus the addend (Gemm's bias, or None). None
    where the node is not such a product.
    """
    from onnx2jax.runtime.constraints import SpecKey

    places = {(kind, i, t): placements.get(SpecKey(node.name, kind, i, t)) for kind, i, t in _keys(node)}
    rows = _rows(node, lambda kind, i, t: places.get((kind, i, t)))
    if rows is None or any(v is None or is_static(v) for v in inputs[:2]):
        return None
    x, weight = inputs[0], inputs[1]
    if node.op_type == "Gemm":
        if int(attrs.get("transA", 0)) or np.ndim(x) != 2:
            return None
        weight = weight.T if int(attrs.get("transB", 0)) else weight
    if np.ndim(weight) != 2 or np.ndim(x) < 2:
        return None
    if len(tuple(places[("in", 0, node.input[0])].sharding.spec)) != np.ndim(x):
        return None
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
    partials = jnp.einsum("...nd,ndf->n...f", x_view, w_view, precision=jax.lax.Precision.HIGHEST)
    partials = jax.lax.with_sharding_constraint(partials, NamedSharding(mesh, PartitionSpec(rows)))
    addend = None
    if node.op_type == "Gemm":
        if float(attrs.get("alpha", 1.0)) != 1.0:
            partials = partials * jnp.asarray(attrs["alpha"], x.dtype)
        if len(inputs) > 2 and inputs[2] is not None:
            bias, beta = jnp.asarray(inputs[2]), float(attrs.get("beta", 1.0))
            addend = bias if beta == 1.0 else bias * jnp.asarray(beta, x.dtype)
    return partials, addend


def _rows(node: onnx.NodeProto, place: Callable) -> Any:
    """The mesh axes a row-parallel product's contraction is split over (output replicated), or None."""
    if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2 or not node.output:
        return None
    x, weight, out = (place(k, i, t) for k, i, t in (("in", 0, node.input[0]), ("in", 1, node.input[1]), ("out", 0, node.output[0])))
    if None in (x, weight, out) or any(p.fused for p in (x, weight, out)):
        return None
    if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] and not _replicated(place("in", 2, node.input[2])):
        return None
    w_spec = tuple(weight.sharding.spec) + (None,) * (2 - len(tuple(weight.sharding.spec)))
    if len(w_spec) != 2:
        return None
    if node.op_type == "Gemm":
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        if int(attrs.get("transA", 0)):
            return None
        if int(attrs.get("transB", 0)):
            w_spec = w_spec[::-1]
    rows, x_spec = w_spec[0], tuple(x.sharding.spec)
    if rows is None or w_spec[1] is not None or not _replicated(out):
        return None
    if not x_spec or x_spec[-1] != rows or any(e is not None for e in x_spec[:-1]):
        return None
    return rows


def row_parallel(node: onnx.NodeProto, placements: Mapping[Any, Any]) -> bool:
    """Whether ``placements`` make ``node`` a row-parallel product (see `row_parallel_partials`)."""
    from onnx2jax.runtime.constraints import SpecKey

    return _rows(node, lambda kind, i, t: placements.get(SpecKey(node.name, kind, i, t))) is not None


def merging_adds(graph: onnx.GraphProto, placements: Mapping[Any, Any], readers: Mapping[str, int]) -> set[str]:
    """The Adds (replicated output) of sum trees that add two or more row-parallel products' outputs.

    A tree's inner values (products, biases added to them, partial totals)
    have one reader each: the next Add. Adding the products' partial sums
    there and reducing once at the tree's root serves them all (GPT-NeoX:
    attn + bias, mlp + bias, their sum, + x). Elsewhere each product keeps
    its own all-reduce.
    """
    from onnx2jax.runtime.constraints import SpecKey

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
            if not _replicated(placements.get(SpecKey(node.name, "out", 0, out))):
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
