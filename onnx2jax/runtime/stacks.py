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
node not run through the hooks, a parameter of another dtype, a scan body
(whose parameters are its layer's slices: nothing is bundled there). A
product that shares its stack with no other still reads one: running it as
the plain product would save a little time (gpt2's gradient step: 1.03 to
1.11 in `bench/bench_column_stack.py`) but moves float32 rounding enough
that four Adam steps on tiny Llama under TP 8 leave one weight 1.4e-4 from
the one-device run (8.6e-5 from float64 where the stacked run is 2.1e-5),
over `test_train_steps`' 1e-4.
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
from onnx2jax.runtime.placement_keys import SpecKey
from onnx2jax.numerics import dot_precision
from sharding import op_facts

# Nodes a walk from a product's input goes back through (besides the normalisations), given one activation input.
_PASSABLE = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Cast", "Identity", "Flatten"})
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
    producers = {out: node for node in graph.node for out in node.output if out}
    dynamic = _dynamic(graph, params)
    passable = ops_with(lambda f: f.elementwise, domain="") | op_facts.LAYER_NORMS | _PASSABLE

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
        if not all(replicated(place(node, *k)) for k in keys):
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
    readers, nodes = {}, {n.name: n for n in graph.node}
    for members in groups.values():
        tensors = [[t for t, _ in paths[m][1]] for m in members]
        leaf = next(t for t in tensors[0] if all(t in others for others in tensors))
        chains = {}
        for member in members:
            path = paths[member][1]
            upto = [t for t, _ in path].index(leaf)
            chains[member] = tuple((back[0].name, back[1]) for _, back in reversed(path[:upto]))
        bundle = []
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
    places = {(kind, i, t): placements.get(SpecKey(node.name, kind, i, t)) for kind, i, t in node_keys(node)}
    columns = _columns(node, lambda kind, i, t: places.get((kind, i, t)))
    operands = None if columns is None else product_operands(node, inputs, attrs)
    if operands is None:
        return None
    x, weight = operands
    mesh = places[("in", 1, node.input[1])].sharding.mesh
    count = math.prod(mesh.shape[a] for a in (columns if isinstance(columns, tuple) else (columns,)))
    if weight.shape[1] % count:
        return None
    stacked = stack(x, count, columns, mesh)
    if all(isinstance(d, int) for d in np.shape(x)):
        product = jax.shard_map(
            _local_product, mesh=mesh, in_specs=(PartitionSpec(columns), PartitionSpec(None, columns)),
            out_specs=PartitionSpec(columns),
        )(stacked, weight)  # [n, ..., F/n]
        product = jnp.moveaxis(jnp.reshape(product, (count, *x.shape[:-1], weight.shape[1] // count)), 0, -2)
    else:
        # A symbolic dimension (jax.export): jax 0.10.2 crashes (segfault in refine_polymorphic_shapes) calling
        # an exported shard_map, so the same product is written as a dot batched over the stack's axis.
        view = jnp.reshape(weight, (weight.shape[0], count, weight.shape[1] // count))
        view = jax.lax.with_sharding_constraint(view, NamedSharding(mesh, PartitionSpec(None, columns, None)))
        product = jnp.einsum("n...d,dnf->...nf", stacked, view, precision=dot_precision(stacked, view))
    product, addend = gemm_terms(node, inputs, attrs, jnp.reshape(product, (*x.shape[:-1], weight.shape[1])))
    return [product if addend is None else (product + addend).astype(x.dtype)]


def _local_product(stack: jax.Array, weight: jax.Array) -> jax.Array:
    """One device's columns: its copy of x ([1, ..., D]) times its [D, F/n] slice of the weight, a plain 2-D
    product (a dot batched over the stack's axis had XLA on CPU copy every column weight, transposed, on every
    call: 98 MB of temporaries per device on a 336M Llama at TP 8, 1 MB this way)."""
    return jnp.matmul(stack[0], weight, precision=dot_precision(stack, weight))[None]


def stack_of(values: list, count: int, columns: Any, mesh: jax.sharding.Mesh) -> list:
    """Each of ``values`` as a stack [count, ...] split over ``columns``, all sliced from one stacked array.

    One array, so that the stacks' gradients are reduced by one collective.
    """
    flat = (
        jnp.concatenate([jnp.reshape(v, (-1,)) for v in values]) if len(values) > 1 else jnp.reshape(values[0], (-1,))
    )
    stacked = jnp.broadcast_to(flat[None], (count, flat.shape[0]))
    stacked = jax.lax.with_sharding_constraint(stacked, NamedSharding(mesh, PartitionSpec(columns)))
    out, offset = [], 0
    for value in values:
        size = math.prod(np.shape(value))
        out.append(jnp.reshape(stacked[:, offset : offset + size], (count, *np.shape(value))))
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


def node_keys(node: onnx.NodeProto) -> list[tuple[str, int, str]]:
    """(kind, position, tensor) of each named input and output of ``node``, as SpecKeys spell them."""
    return [("in", i, n) for i, n in enumerate(node.input) if n] + [
        ("out", i, n) for i, n in enumerate(node.output) if n
    ]


def _columns(node: onnx.NodeProto, place: Callable) -> Any:
    """The mesh axes a column-parallel product's output columns are split over, or None where it is not one."""
    layout = product_layout(node, place)
    if layout is None or (
        node.op_type == "Gemm"
        and len(node.input) > 2
        and node.input[2]
        and getattr(place("in", 2, node.input[2]), "fused", False)
    ):
        return None
    x, (depth, columns), out = layout
    out_spec = tuple(out.sharding.spec)
    if any(e is not None for e in x.sharding.spec) or columns is None or depth is not None:
        return None
    if not out_spec or out_spec[-1] != columns or any(e is not None for e in out_spec[:-1]):
        return None
    return columns


def product_layout(node: onnx.NodeProto, place: Callable) -> tuple[Any, tuple[Any, Any], Any] | None:
    """(x's placement, W's spec as [input axis, output axis], the output's placement) of a MatMul or Gemm.

    None where it is no such product, or a placement is missing or fused.
    """
    if node.op_type not in op_facts.LINEAR_PRODUCTS or len(node.input) < 2 or not node.output:
        return None
    keys = (("in", 0, node.input[0]), ("in", 1, node.input[1]), ("out", 0, node.output[0]))
    x, weight, out = (place(*key) for key in keys)
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
    return x, w_spec, out


def product_operands(node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any]) -> tuple[Any, Any] | None:
    """(x, W as [D, F]) of a traced MatMul or Gemm; None where one is static or the ranks do not fit."""
    if any(v is None or is_static(v) for v in inputs[:2]):
        return None
    x, weight = inputs[0], inputs[1]
    if node.op_type == "Gemm":
        if int(attrs.get("transA", 0)) or np.ndim(x) != 2:
            return None
        weight = weight.T if int(attrs.get("transB", 0)) else weight
    if np.ndim(weight) != 2 or np.ndim(x) < 2:
        return None
    return x, weight


def gemm_terms(node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any], product: Any) -> tuple[Any, Any]:
    """A Gemm's ``product`` scaled by alpha, and its addend beta * C (None: none, or not a Gemm)."""
    if node.op_type != "Gemm":
        return product, None
    dtype = inputs[0].dtype
    if float(attrs.get("alpha", 1.0)) != 1.0:
        product = product * jnp.asarray(attrs["alpha"], dtype)
    if len(inputs) < 3 or inputs[2] is None:
        return product, None
    bias, beta = jnp.asarray(inputs[2]), float(attrs.get("beta", 1.0))
    return product, bias if beta == 1.0 else bias * jnp.asarray(beta, dtype)


def replicated(placement: Any) -> bool:
    """Whether a placement (None: none written or inferred) holds the whole tensor on every device."""
    return placement is None or (not placement.fused and all(e is None for e in placement.sharding.spec))


def _dynamic(graph: onnx.GraphProto, params: Mapping[str, Any]) -> set[str]:
    """The tensors that depend on a graph input other than through its shape (activations)."""
    fixed = {t.name for t in graph.initializer} | set(params)
    dynamic = {i.name for i in graph.input if i.name not in fixed}
    for node in graph.node:
        if node.op_type in _SHAPE_READERS:
            continue
        if node.attribute and any(
            a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
        ):
            dynamic.update(o for o in node.output if o)
        elif any(name in dynamic for name in node.input):
            dynamic.update(o for o in node.output if o)
    return dynamic


class StackHooks:
    """The stacks' part of `onnx2jax.runtime.constraints.ShardingHooks` (a mixin: it uses the hooks'
    ``placements``, ``_constrain`` and ``sources``, the values each placed value was placed from)."""

    def _init_stacks(
        self, graph: onnx.GraphProto | None, placements: Mapping[Any, Any], params: Mapping[str, Any] | None
    ):
        self.params = dict(params or {})
        self.stacks: dict[tuple, tuple[Any, Any, Any]] = {}
        self.readers = plan_readers(graph, placements, self.params) if graph is not None else {}
        self.leaves = {r.leaf for r in self.readers.values() if r.chain or r.bundle}
        self.chain_nodes = {name for r in self.readers.values() for name, _ in r.chain}
        self.recorded: dict[tuple[str, str], tuple] = {}
        self.sources: dict[int, tuple[Any, Any]] = {}
        # the top-level trace, which only a planned chain compares with (trace_state imports jax.extend)
        self.top_trace = trace_state() if self.readers else None

    def _column_parallel(self, node: onnx.NodeProto, inputs: list, attrs: Mapping[str, Any]) -> list | None:
        """A column-parallel MatMul or Gemm through a shared per-device stack (`onnx2jax.runtime.stacks`)."""
        return column_parallel(node, inputs, attrs, self.placements, lambda *a: self._stack(node.name, *a))

    def _stack(self, product: str, x: Any, count: int, columns: Any, mesh: Any) -> Any:
        """The stack [count, ...] of ``x`` that ``product`` reads: of its planned leaf, through its chain, if the trace matches."""
        reader = self.readers.get(product)
        if reader is not None:
            stacked = self._chain_stack(reader, x, count, columns, mesh)
            if stacked is not None:
                return stacked
        stacked = cached(self.stacks, (id(x), columns), x)
        if stacked is None:
            (stacked,) = stack_of([x], count, columns, mesh)
            store(self.stacks, (id(x), columns), x, stacked)
        return stacked

    def _chain_stack(self, reader: Reader, x: Any, count: int, columns: Any, mesh: Any) -> Any | None:
        """``x``'s stack computed from the stack of ``reader.leaf`` (and of its bundled parameters); None on a mismatch."""
        leaf = self.recorded.get(("tensor", reader.leaf))
        if leaf is None or not _current(leaf) or is_static(leaf[1]):
            return None
        leaf_value = leaf[1]
        bundle = cached(self.stacks, ("bundle", reader.leaf, columns), leaf_value)
        if bundle is None:
            values, names = [leaf_value], [None]
            # ``params`` are the values of the top-level trace: a scan body reads its layer's slices instead.
            bundled = reader.bundle if trace_state() == self.top_trace else ()
            for name, node_name, position in bundled:
                value = self.params.get(name)
                if value is None or is_static(value) or jnp.result_type(value) != jnp.result_type(leaf_value):
                    continue
                values.append(self._constrain(SpecKey(node_name, "in", position, name), value))
                names.append(values[-1])
            bundle = (names, stack_of(values, count, columns, mesh))
            store(self.stacks, ("bundle", reader.leaf, columns), leaf_value, bundle)
        placed, stacks = bundle
        plain, stacked = leaf_value, stacks[0]
        sharding = NamedSharding(mesh, PartitionSpec(columns))
        for node_name, active in reader.chain:
            record = self.recorded.get(("node", node_name))
            if record is None or not _current(record) or not self._reads(record[1][active], plain):
                return None
            _, inputs, output, compute = record
            twin = cached(self.stacks, ("twin", node_name, columns), output)
            if twin is None:
                on = {active: stacked}
                on.update({i: s for i, v in enumerate(inputs) for p, s in zip(placed[1:], stacks[1:]) if v is p})
                twin = on_stack(compute, inputs, on, sharding)
                store(self.stacks, ("twin", node_name, columns), output, twin)
            plain, stacked = output, twin
        return stacked if self._reads(x, plain) else None

    def _reads(self, value: Any, source: Any) -> bool:
        """Whether ``value`` is ``source``, or ``source`` placed for a reader (a constraint: the same values)."""
        made = self.sources.get(id(value))
        return value is source or (made is not None and made[1] is value and made[0] is source)

    def _record(self, node: onnx.NodeProto, inputs: list, outputs: list, compute: Callable | None) -> None:
        """Keeps what later products need: a leaf's value, a chain node's inputs, output and computation."""
        if not self.readers:  # no planned chain (one device, most plans): nothing to keep
            return
        trace = trace_state()
        if node.name in self.chain_nodes and compute is not None and len(outputs) == 1:
            self.recorded[("node", node.name)] = (trace, list(inputs), outputs[0], compute)
        for name, value in zip(node.output, outputs):
            if name in self.leaves:
                self.recorded[("tensor", name)] = (trace, value)
        # A leaf no node produces (a graph input): as its first reader sees it.
        for name, value in zip(node.input, inputs):
            known = self.recorded.get(("tensor", name))
            if name in self.leaves and (known is None or known[0] != trace):
                self.recorded[("tensor", name)] = (trace, value)


def trace_state() -> Any:
    """``jax.extend.core.get_opaque_trace_state()``, imported when first asked for.

    Importing ``jax.extend`` loads Pallas, ~65 ms of every process's start (a
    quarter of a one-device GPT-2's first result over onnxruntime's); only a
    sharded trace asks.
    """
    from jax.extend import core

    return core.get_opaque_trace_state()


def cached(cache: dict, key: tuple, value: Any) -> Any | None:
    """What ``cache`` holds for ``value`` under ``key``, if made in the current trace.

    A scan or control-flow body is traced with the same hooks: what was made
    in one trace must not be read from another (a leaked tracer).
    """
    entry = cache.get(key)
    if entry is None or entry[0] is not value or entry[2] != trace_state():
        return None
    return entry[1]


def _current(entry: tuple) -> bool:
    """Whether a recorded entry (its trace state first) was made in the current trace."""
    return entry[0] == trace_state()


def store(cache: dict, key: tuple, value: Any, made: Any) -> None:
    """Remember ``made`` for ``value`` (kept alive by the entry, so that its id stays unique) in this trace."""
    cache[key] = (value, made, trace_state())


