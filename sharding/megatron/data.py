"""Data parallel or tensor parallel for a vision model: the bytes each moves per call.

In a forward pass, data parallelism moves nothing: each device runs the whole
model on its slice of the batch (the weights are replicated, which costs
memory, not communication). It needs a batch the devices divide, and every
model input batched on axis 0. Tensor parallelism (linear pairs, and the
channel-parallel conv pairs of `sharding.megatron.convs`) splits the weights
and pays one all-reduce of each row's output: ``2 (n - 1) / n`` times that
output's bytes through each device (a ring all-reduce). Given the batch, the
plan takes the one that moves fewer bytes: data parallel when the devices
divide the batch, tensor parallel otherwise; its note gives both numbers.
Only models with a convolution are considered (CNNs, vision and speech
encoders); a text model keeps its Megatron plan.
"""

from __future__ import annotations

import math

from sharding.megatron.graph import PlanGraph
from sharding.megatron.specs import Assignment, split_spec

_FLOAT_BYTES = 4


def tensor_parallel_bytes(graph: PlanGraph, rows: list[str], batch: int, n: int) -> int | None:
    """Bytes through each device per call for the rows' all-reduces, or None when a shape is unknown."""
    by_name = {node.name: node for node in graph.nodes}
    total = 0
    for row in rows:
        shape = graph.shapes.get(by_name[row].output[0])
        if not shape or any(not isinstance(d, int) for d in shape[1:]):
            return None
        total += 2 * (n - 1) * math.prod(shape[1:]) * batch * _FLOAT_BYTES // n
    return total


def _batched_inputs(graph: PlanGraph) -> list[str] | None:
    """The model inputs, when all of them have one first dimension (the batch), else None."""
    names = sorted(graph.inputs)
    firsts = {graph.shapes.get(name, (None,))[0] if graph.shapes.get(name) else None for name in names}
    if not names or len(firsts) != 1 or None in firsts:
        return None
    return names


def data_parallel(
    graph: PlanGraph, rows: list[str], n: int, batch: int | None, notes: list[str]
) -> list[Assignment] | None:
    """The batch-split specs when data parallel moves fewer bytes than the pairs, else None.

    Writes, on every node reading a model input, that input split ``n`` ways
    on axis 0; inference carries the split through the model.
    """
    if batch is None or n == 1 or not any(node.op_type == "Conv" for node in graph.nodes):
        return None
    inputs = _batched_inputs(graph)
    if inputs is None:
        notes.append("data parallel needs every model input batched on axis 0: tensor parallel instead")
        return None
    if batch % n:
        notes.append(f"data parallel needs a batch divisible by the {n} devices (batch {batch}): "
                     "tensor parallel instead")
        return None
    moved = tensor_parallel_bytes(graph, rows, batch, n)
    notes.append(f"data parallel: batch {batch} split {n} ways moves 0 bytes per call; tensor "
                 f"parallel ({len(rows)} all-reduces) would move "
                 f"{moved if moved is not None else 'an unknown number of'} bytes through each device "
                 "(data parallel replicates the weights instead of splitting them)")
    return [
        Assignment(graph.nodes[index].name, split_spec(name, 0, n, n), "data parallel (batch)")
        for name in inputs
        for index in graph.consumers.get(name, [])
    ]
