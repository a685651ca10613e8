"""Fused projections for the Megatron plan: how a linear's output is cut into parts.

Exporters write one linear for several projections (GPT-2's ``c_attn``, Phi-3's
``qkv_proj`` and ``gate_up_proj``, GPT-BigCode's multi-query ``c_attn``) and cut
its feature axis afterwards: a Split (equal parts or explicit sizes), or
Slices of the last axis, possibly behind Reshapes/Unsqueezes that keep that
axis. `feature_parts` finds that cut and the attention heads of every part:

* equal parts (q|k|v of equal widths, gate|up): the linear is split through a
  fused axis ``[{k, 1 shard}, {N/k, w shards}]`` and each part is split on its
  own, locally;
* unequal parts (q|k|v under grouped-query or multi-query attention): no
  single spec of the weight gives every device matching query and key/value
  heads, so the projection stays replicated and each *part* is split by heads
  where it is cut out (a local slice of a replicated tensor, no collective);
* a Reshape that views the feature axis as ``[k, heads, head_dim]`` (q/k/v
  stacked before the heads) is k equal parts.

A per-head interleaved layout (GPT-NeoX: ``[heads, 3·head_dim]``, each head's
q, k and v contiguous) needs nothing special: a plain split of N by heads keeps
each head's q, k and v together, and the heads come from the Reshape.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import onnx.numpy_helper

# Ops between a linear and the cut of its feature axis that keep that axis.
_KEEP_LAST = frozenset({"Reshape", "Unsqueeze", "Squeeze", "Identity"})


@dataclass(frozen=True)
class Part:
    """One part of a fused projection's output.

    Attributes:
        node: The Split or Slice node that cuts it out.
        source: The tensor that node cuts (the linear's output, or a view of it).
        tensor: The part.
        width: Its features.
        heads: Its attention heads (from the Reshape that splits it, or its
            width over the head size of its siblings); None when unknown.
    """

    node: str
    source: str
    tensor: str
    width: int
    heads: int | None = None


@dataclass(frozen=True)
class FeatureCut:
    """How a linear's output is cut on its feature axis.

    Attributes:
        parts: k for k equal parts (1 when there is no cut); 0 when the parts
            are unequal or unknown.
        heads: Heads per part when every part has the same known count.
        pieces: The parts, in feature order (empty when there is no cut or
            their sizes are unknown).
    """

    parts: int
    heads: int | None
    pieces: tuple[Part, ...] = ()


def _ints(graph, name: str) -> list[int] | None:
    proto = graph.init_protos.get(name)
    if proto is None:
        return None
    return [int(v) for v in onnx.numpy_helper.to_array(proto).ravel()]


def _last_axis(graph, tensor: str, axis: int) -> bool:
    rank = graph.rank(tensor)
    return rank is not None and axis % rank == rank - 1


def _slices(graph, tensor: str, nodes: list, width: int) -> list[Part] | None:
    """The parts when every consumer is a unit-step Slice of the last axis tiling [0, width)."""
    found = []
    for node in nodes:
        if node.op_type != "Slice" or len(node.input) < 4:
            return None
        starts, ends, axes = (_ints(graph, node.input[i]) for i in (1, 2, 3))
        steps = _ints(graph, node.input[4]) if len(node.input) > 4 and node.input[4] else [1]
        if None in (starts, ends, axes, steps) or len(axes) != 1 or steps != [1]:
            return None
        if not _last_axis(graph, tensor, axes[0]):
            return None
        start, end = starts[0], min(ends[0], width)
        found.append((start, Part(node.name, tensor, node.output[0], end - start)))
    found.sort(key=lambda item: item[0])
    position = 0
    for start, part in found:
        if start != position or part.width <= 0:
            return None
        position += part.width
    return [part for _, part in found] if position == width else None


def _split(graph, tensor: str, node, width: int) -> list[Part] | None:
    if not _last_axis(graph, tensor, graph.attr(node, "axis", 0)):
        return None
    k = len(node.output)
    if len(node.input) > 1 and node.input[1]:
        sizes = _ints(graph, node.input[1])
    else:
        sizes = graph.attr(node, "split")
        if sizes is None and width % k == 0:
            sizes = [width // k] * k
    if sizes is None or len(sizes) != k or sum(sizes) != width:
        return None
    return [Part(node.name, tensor, out, size) for out, size in zip(node.output, sizes)]


def _heads(graph, tensor: str, width: int) -> int | None:
    """Heads of the first Reshape after ``tensor`` that views its last axis (width) as ``[heads, head_dim]``.

    The head count is read from the Reshape's inferred output shape; where ONNX's shape inference left it
    symbolic (a dynamo export's target ``Concat(batch, seq, [-1], [head_dim])``: only the head size is a
    constant), it is ``width // head_dim`` when the Reshape keeps every leading axis, by name, and splits only
    the last one.
    """
    frontier = [tensor]
    for _ in range(3):
        following = []
        for name in frontier:
            shape = graph.shapes.get(name)
            for index in graph.consumers.get(name, []):
                node = graph.nodes[index]
                out = graph.shapes.get(node.output[0]) if node.output else None
                if node.op_type == "Reshape" and out and shape and shape[-1] == width:
                    heads = _split_heads(tuple(shape), tuple(out), width)
                    if heads is not None:
                        return heads
                if node.op_type in ("Add", "Mul", "Cast", "Identity") and node.output:
                    following.append(node.output[0])
        frontier = following
    return None


def _split_heads(shape: tuple, out: tuple, width: int) -> int | None:
    """Heads when a Reshape from ``shape`` (last axis ``width``) to ``out`` ends in ``[heads, head_dim]``."""
    if len(out) < 2 or not isinstance(out[-1], int) or out[-1] <= 0 or width % out[-1]:
        return None
    heads = width // out[-1]
    if isinstance(out[-2], int):
        return heads if out[-2] == heads else None
    # A symbolic head count: sure only when the leading axes are the input's own (the same names or sizes).
    return heads if out[:-2] == shape[:-1] and None not in out[:-2] else None


def _stacked(graph, tensor: str, node, width: int) -> FeatureCut | None:
    """A Reshape viewing the last axis as ``[k, heads, head_dim]``: k equal parts."""
    rank, out = graph.rank(tensor), graph.shapes.get(node.output[0])
    if rank is None or not out or len(out) != rank + 2:
        return None
    k, heads, dim = out[-3:]
    if not all(isinstance(v, int) and v > 0 for v in (k, heads, dim)) or k * heads * dim != width:
        return None
    return FeatureCut(k, heads) if 1 < k <= 4 else None


def feature_parts(graph, output: str, width: int) -> FeatureCut:
    """How the linear output ``output`` (``width`` features) is cut on its last axis."""
    tensor = output
    for _ in range(4):
        consumers = [graph.nodes[i] for i in graph.consumers.get(tensor, [])]
        if not consumers:
            break
        if len(consumers) == 1 and consumers[0].op_type in _KEEP_LAST:
            node = consumers[0]
            stacked = _stacked(graph, tensor, node, width) if node.op_type == "Reshape" else None
            if stacked is not None:
                return stacked
            out = graph.shapes.get(node.output[0])
            if not out or out[-1] != width:
                break
            tensor = node.output[0]
            continue
        if len(consumers) == 1 and consumers[0].op_type == "Split":
            pieces = _split(graph, tensor, consumers[0], width)
        elif all(node.op_type == "Slice" for node in consumers):
            pieces = _slices(graph, tensor, consumers, width)
        else:
            break
        if pieces is None:
            return FeatureCut(0, None)
        return _with_heads(graph, pieces)
    return FeatureCut(1, _heads(graph, output, width))


def _with_heads(graph, pieces: list[Part]) -> FeatureCut:
    """Equal parts become a fused axis; heads per part from their Reshapes (or head size)."""
    heads = [_heads(graph, p.tensor, p.width) for p in pieces]
    sizes = {p.width // h for p, h in zip(pieces, heads) if h}
    if len(sizes) == 1:  # one head size: parts without a Reshape of their own (MQA's k/v)
        size = sizes.pop()
        heads = [h or (p.width // size if p.width % size == 0 else None) for p, h in zip(pieces, heads)]
    pieces = [dataclasses.replace(p, heads=h) for p, h in zip(pieces, heads)]
    if len({p.width for p in pieces}) == 1:
        same = {p.heads for p in pieces}
        return FeatureCut(len(pieces), same.pop() if len(same) == 1 else None, tuple(pieces))
    return FeatureCut(0, None, tuple(pieces))
