"""The automatic pipeline cut (``auto:S``): stages balanced by estimated time, cut where one activation crosses.

A stage's time is estimated at a declared batch x sequence (every symbolic
dimension of the graph's inputs bound: the first axis to the batch, the
others to the sequence): the FLOPs of its MatMul/Gemm nodes at
:data:`FLOPS_PER_SECOND`, plus the bytes its nodes read from parameters and
write, at :data:`BYTES_PER_SECOND`. A parameter counts at every node that
reads it, so a tied embedding weighs on the stage of its lookup and on the
stage of the LM head that reuses it (balancing parameter bytes counted once
put GPT-2's whole head, its costliest matmul, on a stage charged nothing
for it). Each stage's parameter bytes, each counted once, are reported as
well: they are what a stage's devices hold.

Framework-neutral: onnx and numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from sharding.op_facts import LINEAR_PRODUCTS
from sharding.partition import GraphIndex, require_unique_names
from sharding.shapes import node_inputs, tensor_shapes

FLOPS_PER_SECOND = 1e11
"""The estimate's compute rate (a few CPU cores; only the ratio to :data:`BYTES_PER_SECOND` matters)."""

BYTES_PER_SECOND = 2e10
"""The estimate's memory rate."""

DEFAULT_BATCH, DEFAULT_SEQUENCE = 1, 128


@dataclass(frozen=True)
class Cut:
    """An automatic cut: after which node, what crosses, and each stage's share.

    Attributes:
        after: the last node of each stage but the last.
        crossing: the tensor(s) live across each cut.
        param_bytes: per stage, the parameter bytes its nodes read first (what it holds).
        flops: per stage, its MatMul/Gemm FLOPs at ``shape`` (None: shapes unknown).
        seconds: per stage, its estimated time at ``shape``.
        shape: the declared (batch, sequence) the estimate is for.
    """

    after: tuple[str, ...]
    crossing: tuple[tuple[str, ...], ...]
    param_bytes: tuple[int, ...]
    flops: tuple[int, ...] | None
    seconds: tuple[float, ...] = ()
    shape: tuple[int, int] = (DEFAULT_BATCH, DEFAULT_SEQUENCE)

    def balance(self) -> float:
        """The slowest stage's estimated time over the fastest's (1.0: perfectly balanced)."""
        if not self.seconds or min(self.seconds) <= 0:
            return math.inf if self.seconds else 1.0
        return max(self.seconds) / min(self.seconds)

    def describe(self) -> list[str]:
        """One line per cut and per stage, and the expected balance, for printing."""
        count = len(self.param_bytes)
        lines = [
            f"auto:{count} cuts after {node!r}: stage {stage} sends {', '.join(map(repr, tensors))} to stage {stage + 1}"
            for stage, (node, tensors) in enumerate(zip(self.after, self.crossing))
        ]
        if self.seconds:
            # Parameter bytes per stage are printed with the stages themselves; here what the balance rests on.
            for stage, seconds in enumerate(self.seconds):
                flops = f"{self.flops[stage]:,} FLOPs, " if self.flops else ""
                lines.append(f"stage {stage}: {flops}~{seconds * 1e3:.3g} ms estimated")
            batch, sequence = self.shape
            lines.append(
                f"expected balance at batch {batch} x sequence {sequence}: slowest/fastest stage "
                f"{self.balance():.2f} (FLOPs at {FLOPS_PER_SECOND / 1e9:g} GFLOP/s plus bytes read and "
                f"written at {BYTES_PER_SECOND / 1e9:g} GB/s; tied parameters counted where each reader runs)"
            )
        return lines


def declared_shapes(model: onnx.ModelProto, batch: int, sequence: int) -> dict[str, list[int]]:
    """The graph inputs' shapes with every symbolic dimension bound: axis 0 to ``batch``, others to ``sequence``."""
    initialized = {i.name for i in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initialized or not value.type.HasField("tensor_type"):
            continue
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [
            d.dim_value if d.HasField("dim_value") else (batch if axis == 0 else sequence) for axis, d in enumerate(dims)
        ]
    return shapes


def auto_stages(
    model: onnx.ModelProto, num_stages: int, *, batch: int = DEFAULT_BATCH, sequence: int = DEFAULT_SEQUENCE
) -> tuple[dict[str, int], Cut]:
    """Cuts the graph into ``num_stages`` stages of balanced estimated time where only one activation crosses.

    Candidate cuts are places in the topological order across which a single
    data tensor (not shape-only, not a graph input) is live: the residual
    stream between transformer layers or halves of a layer. Among them the
    cut minimises the slowest stage's estimated time (module docstring) at
    ``batch`` x ``sequence``; where shapes stay unknown, bytes alone count.

    Raises:
        ValueError: fewer candidate places than ``num_stages - 1``.
    """
    if num_stages < 1:
        raise ValueError(f"auto:S needs S >= 1, got {num_stages}")
    graph = model.graph
    require_unique_names(graph)
    index = GraphIndex.of(graph)
    order = index.topological_order()
    shape_only = index.shape_only()
    sizes = {i.name: _nbytes(i) for i in graph.initializer if i.data_type in _FLOAT_TYPES}
    shapes, _ = tensor_shapes(model, declared_shapes(model, batch, sequence))
    seen: set[str] = set()
    held, seconds, flops = [], [], []
    known = True
    for i in order:
        node = index.nodes[i]
        if all(o in shape_only for o in node.output if o):  # recomputed where read: free
            held.append(0), seconds.append(0.0), flops.append(0)
            continue
        reads = [n for n in node_inputs(node) if n in sizes]
        own = [n for n in reads if n not in seen]
        seen.update(own)
        held.append(sum(sizes[n] for n in own))
        node_flops = _flops(node, shapes, batch, sequence)
        known = known and node_flops is not None
        flops.append(node_flops or 0)
        written = sum(_bytes_of(shapes.get(o)) for o in node.output if o)
        seconds.append((node_flops or 0) / FLOPS_PER_SECOND + (sum(sizes[n] for n in reads) + written) / BYTES_PER_SECOND)
    position = {i: rank for rank, i in enumerate(order)}
    live: list[set[str]] = [set() for _ in order]  # data tensors live across the gap after rank r
    for tensor, producer in index.producer.items():
        if tensor in shape_only:
            continue
        last = max((position[c] for c in index.consumers.get(tensor, ())), default=position[producer])
        if tensor in index.outputs:
            last = len(order)
        for rank in range(position[producer], min(last, len(order) - 1)):
            live[rank].add(tensor)
    candidates = []
    prefix = np.cumsum(seconds) if sum(seconds) else np.cumsum(held, dtype=np.float64)
    for rank in range(len(order) - 1):
        if len(live[rank]) == 1 and (not candidates or prefix[rank] != prefix[candidates[-1]]):
            candidates.append(rank)
    if len(candidates) < num_stages - 1:
        raise ValueError(
            f"auto:{num_stages}: only {len(candidates)} place(s) in the graph where one activation crosses; "
            f"cannot cut it into {num_stages} stages"
        )
    chosen = _best_cuts(prefix, candidates, num_stages)
    stage_of, stage = {}, 0
    bounds = set(chosen)
    for rank, i in enumerate(order):
        stage_of[index.nodes[i].name] = stage
        if rank in bounds:
            stage += 1
    edges = list(zip([0] + [r + 1 for r in chosen], [r + 1 for r in chosen] + [len(order)]))
    cut = Cut(
        after=tuple(index.nodes[order[r]].name for r in chosen),
        crossing=tuple(tuple(sorted(live[r])) for r in chosen),
        param_bytes=tuple(sum(held[a:b]) for a, b in edges),
        flops=tuple(sum(flops[a:b]) for a, b in edges) if known else None,
        seconds=tuple(float(sum(seconds[a:b])) for a, b in edges),
        shape=(batch, sequence),
    )
    return stage_of, cut


def _best_cuts(prefix: np.ndarray, candidates: list[int], stages: int) -> list[int]:
    """The ``stages - 1`` candidates minimising the largest stage cost (dynamic programming)."""
    total = float(prefix[-1])
    points = [-1] + candidates
    at = [float(prefix[c]) if c >= 0 else 0.0 for c in points]
    # best[k][j]: smallest max cost of k stages ending at points[j]; back[k][j]: the previous point.
    best = [[math.inf] * len(points) for _ in range(stages)]
    back = [[-1] * len(points) for _ in range(stages)]
    best[0][0] = 0.0
    for k in range(1, stages):
        for j in range(1, len(points)):
            for i in range(j):
                value = max(best[k - 1][i], at[j] - at[i])
                if value < best[k][j] - 1e-12:
                    best[k][j], back[k][j] = value, i
    last = min(range(len(points)), key=lambda j: max(best[stages - 1][j], total - at[j]))
    chosen = []
    k, j = stages - 1, last
    while k > 0:
        chosen.append(points[j])
        j, k = back[k][j], k - 1
    return sorted(chosen)


_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}


def _nbytes(init: onnx.TensorProto) -> int:
    itemsize = onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
    return int(np.prod(init.dims, dtype=np.int64)) * itemsize


def _bytes_of(shape: Sequence | None) -> int:
    """Bytes of a float32 tensor of ``shape`` (0 when any dimension is unknown)."""
    if shape is None or not all(isinstance(d, int) for d in shape):
        return 0
    return 4 * math.prod(shape)


def _flops(node: onnx.NodeProto, shapes: dict, batch: int, sequence: int) -> int | None:
    """2*M*K*N of a MatMul/Gemm (0 for other ops); None when its ranks are unknown.

    ONNX shape inference (without data propagation) leaves the dimensions a
    computed Reshape target sets unknown; such a dimension is taken as the
    tokens, ``batch * sequence``, on the first axis of a 2-D operand (an
    exporter's Gemm on ``[-1, width]``) and as ``batch`` elsewhere.
    """
    if node.op_type not in LINEAR_PRODUCTS:
        return 0
    a, out = shapes.get(node.input[0]), shapes.get(node.output[0])
    if a is None or out is None:
        return None
    guess = lambda dims: [d if isinstance(d, int) else (batch * sequence if len(dims) == 2 and i == 0 else batch)  # noqa: E731
                          for i, d in enumerate(dims)]
    a, out = guess(a), guess(out)
    transposed = node.op_type == "Gemm" and any(x.name == "transA" and x.i for x in node.attribute)
    k = a[0] if transposed else a[-1]
    return 2 * math.prod(out) * int(k)


__all__ = ["BYTES_PER_SECOND", "Cut", "DEFAULT_BATCH", "DEFAULT_SEQUENCE", "FLOPS_PER_SECOND", "auto_stages", "declared_shapes"]
