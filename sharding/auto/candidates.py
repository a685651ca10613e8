"""The layouts the automatic search weighs: data x tensor factorisations and the pattern choices inside.

For ``n`` devices, every factorisation ``n = data x tensor`` whose data degree
divides the batch. Inside tensor parallelism, the choices the Megatron and CNN
patterns know (`sharding.megatron.megatron_layout`), each a `Candidate`:

* ``megatron``: the hand plan at ``tensor`` devices (column/row pairs, the
  vocabulary split, conv channel pairs, the layers it leaves whole);
* ``kv-groups``: key/value projections split by kv-head groups (``gqa="groups"``),
  where the model has fewer kv heads than shards;
* ``weights-only``: only the specs on weight nodes (MatMul/Gemm/Conv reading a
  parameter, an embedding Gather, the Transposes of parameters), the specs of
  parameters wherever they are read (a bias Add) and those of graph outputs; inference completes the rest, which can reach fewer collectives
  than the specs the hand plan writes on activations;
* ``embedding-whole``: the vocabulary tables and the LM head left whole
  (their all-reduce saved, their memory not).

A ``data`` degree above one lifts a layout onto a ``data x tensor`` grid (device
``i * tensor + j`` is data replica ``i``, tensor shard ``j``): parameters keep
their tensor split and are replicated over the data replicas; activations gain
a split of axis 0 (the batch) over the replicas; each model input with the
batch on axis 0 is split on the nodes reading it. ``tensor = 1`` is plain
data parallelism.

Layers repeat, and a layout treats every layer of one pattern alike, so the
candidates number a few per factorisation whatever the depth; sharding
inference memoises a repeated layer's rule results (`sharding.infer`), so
evaluating one grows with the number of distinct layers, not their count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from sharding.auto.analysis import PlanAnalysis, node_configs
from sharding.megatron import megatron_layout
from sharding.megatron.specs import Assignment, split_spec
from sharding.model_configs import NodeConfig
from sharding.rules.views import renamed
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather", "MatMulNBits"})
_THROUGH = frozenset({"Transpose", "Cast", "Reshape", "Identity"})


@dataclass(frozen=True, eq=False)
class Candidate:
    """One layout: its degrees, the pattern choice, and its specs as data.

    Attributes:
        name: E.g. ``"data 2 x tensor 4, weights-only"``.
        data: Data-parallel degree.
        tensor: Tensor-parallel degree.
        variant: ``megatron``, ``kv-groups``, ``weights-only``, ``embedding-whole``
            or ``replicated`` (tensor 1).
        base: The tensor layout's specs on ``tensor`` devices, by node: the parameters' layout, which
            a data degree only replicates (so the parameter bytes per device are known before lifting).
        notes: The pattern's notes (what it left whole and why).
        make: Builds the specs on every device (the lifted layout), on first use of ``written``;
            None when ``base`` is the layout itself.
    """

    name: str
    data: int
    tensor: int
    variant: str
    base: Mapping[str, NodeConfig]
    notes: tuple[str, ...] = ()
    make: Callable[[], Mapping[str, NodeConfig] | None] | None = field(default=None, compare=False)

    @functools.cached_property
    def written(self) -> Mapping[str, NodeConfig] | None:
        """The specs, by node (configuration ``auto``); None when the layout cannot be lifted."""
        return self.base if self.make is None else self.make()


def factorisations(num_devices: int) -> list[tuple[int, int]]:
    """Every ``(data, tensor)`` with ``data * tensor == num_devices``, tensor-heaviest first."""
    return [(num_devices // t, t) for t in range(num_devices, 0, -1) if num_devices % t == 0]


def weight_nodes(analysis: PlanAnalysis) -> set[str]:
    """Nodes that read a parameter: products and lookups on a weight, and the Transposes/Casts in between."""
    graph = analysis.graph
    weights = set(graph.inits)
    through = set()
    for node in graph.nodes:
        if node.op_type in _THROUGH and node.input and node.input[0] in weights:
            weights.update(node.output)
            through.add(node.name)
    found = set(through)
    for node in graph.nodes:
        if node.op_type not in _WEIGHT_OPS:
            continue
        reads = node.input[:1] if node.op_type == "Gather" else node.input[1:]
        if any(name in weights for name in reads):
            found.add(node.name)
    return found


def _weights_only(analysis: PlanAnalysis, assignments: tuple[Assignment, ...]) -> tuple[Assignment, ...]:
    keep = weight_nodes(analysis)
    kept_tensors = analysis.graph.outputs | set(analysis.initializers)
    return tuple(a for a in assignments if a.node in keep or a.spec.tensor_name in kept_tensors)


def _embedding_whole(assignments: tuple[Assignment, ...]) -> tuple[Assignment, ...]:
    return tuple(a for a in assignments if "embedding" not in a.role and "head" not in a.role)


def _spread(devices: tuple[int, ...], data: int, tensor: int) -> tuple[int, ...]:
    return tuple(i * tensor + d for i in range(data) for d in devices)


def lift(spec: ShardingSpec, data: int, tensor: int, batched: bool) -> ShardingSpec | None:
    """A ``tensor``-device spec on the ``data x tensor`` grid (module docstring); None when it cannot be.

    Args:
        batched: The tensor has the batch on axis 0 (an activation): it gains
            that split. Otherwise (a parameter) it is replicated over the data replicas.
    """
    shards = [spec.devices_of_shard(k) for k in range(spec.num_shards)]
    if not batched:
        return ShardingSpec(
            spec.tensor_name, spec.sharded_dims, tuple(-k - 1 for k in range(len(shards))),
            tuple((-k - 1, _spread(s, data, tensor)) for k, s in enumerate(shards)),
        )
    if any(dim.axis == 0 for dim in spec.sharded_dims):
        return None
    dims = (ShardedDim(0, (SimpleShardedDim(data),)), *spec.sharded_dims)
    groups = [tuple(i * tensor + d for d in s) for i in range(data) for s in shards]
    entries, table = [], []
    for group in groups:
        if len(group) == 1:
            entries.append(group[0])
        else:
            table.append((-len(table) - 1, group))
            entries.append(table[-1][0])
    return ShardingSpec(spec.tensor_name, dims, tuple(entries), tuple(table))


def _batched(analysis: PlanAnalysis, tensor: str, batch: int) -> bool:
    shape = analysis.shapes.get(tensor)
    return tensor not in analysis.initializers and bool(shape) and shape[0] == batch


def batch_inputs(analysis: PlanAnalysis, batch: int | None) -> list[str] | None:
    """The model inputs, when every one has the batch on axis 0; else None (no data parallelism)."""
    graph = analysis.graph
    names = sorted(graph.inputs)
    if batch is None or not names:
        return None
    for name in names:
        shape = analysis.shapes.get(name)
        if not shape or shape[0] != batch:
            return None
    return names


def lifted(
    analysis: PlanAnalysis, assignments: tuple[Assignment, ...], data: int, tensor: int, batch: int
) -> tuple[Assignment, ...] | None:
    """``assignments`` (made for ``tensor`` devices) on ``data x tensor`` devices, with the inputs' batch split."""
    out = []
    made: dict[tuple, ShardingSpec | None] = {}  # layers repeat: one lift per distinct layout
    for a in assignments:
        batched = _batched(analysis, a.spec.tensor_name, batch)
        key = (a.spec.sharded_dims, a.spec.devices, a.spec.groups, batched)
        if key not in made:
            made[key] = lift(a.spec, data, tensor, batched)
        if made[key] is None:
            return None
        out.append(Assignment(a.node, renamed(made[key], a.spec.tensor_name), a.role))
    written = {(a.node, a.spec.tensor_name) for a in out}
    for name in batch_inputs(analysis, batch) or []:
        for index in analysis.graph.consumers.get(name, []):
            node = analysis.graph.nodes[index].name
            if (node, name) not in written:
                base = ShardingSpec.replicated(name, range(tensor)) if tensor > 1 else ShardingSpec(name, (), (0,))
                spec = lift(base, data, tensor, True)
                out.append(Assignment(node, spec, "data parallel (batch)"))
    return tuple(out)


def _data_only(analysis: PlanAnalysis, data: int) -> tuple[Assignment, ...]:
    graph = analysis.graph
    return tuple(
        Assignment(graph.nodes[index].name, split_spec(name, 0, data, data), "data parallel (batch)")
        for name in sorted(graph.inputs)
        for index in graph.consumers.get(name, [])
    )


def candidates(analysis: PlanAnalysis, num_devices: int, batch: int | None) -> Iterator[Candidate]:
    """Every layout of the module docstring for ``num_devices`` devices, the data degree dividing ``batch``."""
    batched = batch_inputs(analysis, batch) is not None
    layouts: dict[int, list[tuple[str, tuple[Assignment, ...], tuple[str, ...]]]] = {}
    for data, tensor in factorisations(num_devices):
        if data > 1 and (not batched or batch % data):
            continue
        if tensor == 1:
            if data == 1:
                yield Candidate("replicated", 1, 1, "replicated", {}, ())
            else:
                yield Candidate(f"data {data}", data, 1, "data", node_configs(_data_only(analysis, data)))
            continue
        if tensor not in layouts:
            layouts[tensor] = list(_tensor_layouts(analysis, tensor))
        for variant, assignments, notes in layouts[tensor]:
            base = node_configs(assignments)
            if data == 1:
                yield Candidate(f"tensor {tensor}, {variant}", 1, tensor, variant, base, notes)
                continue

            def make(assignments=assignments, data=data, tensor=tensor):
                found = lifted(analysis, assignments, data, tensor, batch)
                return None if found is None else node_configs(found)

            yield Candidate(f"data {data} x tensor {tensor}, {variant}", data, tensor, variant, base, notes, make)


def _tensor_layouts(analysis: PlanAnalysis, tensor: int) -> Iterator[tuple[str, tuple[Assignment, ...], tuple[str, ...]]]:
    seen: set[frozenset] = set()

    def fresh(assignments: tuple[Assignment, ...]) -> bool:
        key = frozenset((a.node, a.spec) for a in assignments)
        if key in seen or not assignments:
            return False
        seen.add(key)
        return True

    base = megatron_layout(analysis.model, tensor, graph=analysis.graph)
    groups = megatron_layout(analysis.model, tensor, gqa="groups", graph=analysis.graph)
    for variant, layout in (("megatron", base), ("kv-groups", groups)):
        if fresh(layout.assignments):
            yield variant, layout.assignments, layout.notes
        weights = _weights_only(analysis, layout.assignments)
        if fresh(weights):
            yield ("weights-only" if variant == "megatron" else "kv-groups, weights-only"), weights, layout.notes
    whole = _embedding_whole(base.assignments)
    if fresh(whole):
        yield "embedding-whole", whole, base.notes


def hand_plan(analysis: PlanAnalysis, num_devices: int, batch: int | None) -> Candidate:
    """`megatron_plan`'s layout (data parallel for a CNN given a batch), as a candidate."""
    layout = megatron_layout(analysis.model, num_devices, batch=batch, graph=analysis.graph)
    data = num_devices if any(a.role == "data parallel (batch)" for a in layout.assignments) else 1
    written = node_configs(layout.assignments)
    return Candidate("hand plan (megatron_plan)", data, num_devices // data, "hand", written, layout.notes)

