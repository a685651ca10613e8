"""The real total length for the If a builder graph takes on the attention mask's width (LongRoPE).

onnxruntime-genai's model builder writes phi3's long-context rope (LongRoPE) as ``If(Greater(width, original
context))`` choosing between two cos/sin caches, ``width`` being ``Gather(Shape(attention_mask), 1)``: on CPU
onnxruntime-genai grows the mask by one column a step (``PositionInputs::UpdateAttentionMask``), so the width is
the run's total length and the long factors start once it passes ``original_max_position_embeddings``.

The decode program feeds a mask as wide as its cache buffer (one compile for every step), so that width is the
buffer's, not the length. :func:`feed_total_length` gives such an If's condition a graph input of its own,
`TOTAL_LENGTH` (int64 scalar), in place of the width, and makes the If a ``Where`` over its two constant tables
(the shorter padded with zero rows: the tables differ in length, and a choice made on data needs one shape).
The generation programs feed `TOTAL_LENGTH` the real total length, as data; a plain call of the model feeds it
the mask's width (:func:`fill_total_length`), so that a call computes what onnxruntime computes.
GroupQueryAttention's own ``total_sequence_length`` keeps the width (it sizes the present cache: the buffer's).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx

TOTAL_LENGTH = "onnx2jax.total_sequence_length"
"""The graph input :func:`feed_total_length` adds: the run's total length (int64 scalar)."""


def mask_width_conditions(graph: onnx.GraphProto, attention_mask: str | None) -> list[onnx.NodeProto]:
    """The ``If`` nodes of ``graph`` that choose between constant tables (LongRoPE's caches) on the mask's
    width (``Greater(Gather(Shape(mask), 1), k)``, possibly through a Cast), each branch only Constants of
    one rank and one dtype whose shapes differ at most in their first axis."""
    if attention_mask is None:
        return []
    producers = {out: node for node in graph.node for out in node.output if out}
    constants = {  # the small ones held in the file (an index), never the weights kept outside it
        init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer
        if init.data_location != onnx.TensorProto.EXTERNAL and len(init.dims) <= 1
    }
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = [a for a in node.attribute if a.name == "value"]
            if value:
                constants[node.output[0]] = onnx.numpy_helper.to_array(value[0].t)
    found = []
    for node in graph.node:
        greater = producers.get(node.input[0]) if node.op_type == "If" and node.input else None
        if (greater is not None and greater.op_type == "Greater"
                and _is_mask_width(greater.input[0], producers, constants, attention_mask)
                and _branch_tables(node) is not None):
            found.append(node)
    return found


def feed_total_length(graph: onnx.GraphProto, attention_mask: str | None) -> str | None:
    """Rewrites, in place, every ``If`` :func:`mask_width_conditions` finds: its ``Greater`` reads
    `TOTAL_LENGTH` (a graph input added last) in place of the width, and the ``If`` becomes a ``Where`` over its
    branches' tables, the shorter padded with zero rows to the longer's (so the choice is data, one program
    for every length; the rotary ops read only the rows of positions below the total length, which both hold
    as the If gave them). Returns `TOTAL_LENGTH` where it rewrote one, else None (the graph untouched)."""
    found = mask_width_conditions(graph, attention_mask)
    if not found:
        return None
    producers = {out: node for node in graph.node for out in node.output if out}
    for node in found:
        producers[node.input[0]].input[0] = TOTAL_LENGTH
        then_tables, else_tables = _branch_tables(node)
        replacement = []
        for i, (out, high, low) in enumerate(zip(node.output, then_tables, else_tables)):
            rows = max(high.shape[0], low.shape[0])
            tables = []
            for which, table in (("then", high), ("else", low)):
                padded = np.concatenate([table, np.zeros((rows - table.shape[0], *table.shape[1:]), table.dtype)])
                name = f"{out}/{which}_table"
                replacement.append(onnx.helper.make_node(
                    "Constant", [], [name], value=onnx.numpy_helper.from_array(padded, name)))
                tables.append(name)
            where = onnx.helper.make_node("Where", [node.input[0], *tables], [out], name=f"{node.name}/Where{i}")
            replacement.append(where)
        at = list(graph.node).index(node)
        graph.node.remove(node)
        for offset, new in enumerate(replacement):
            graph.node.insert(at + offset, new)
    graph.input.append(onnx.helper.make_tensor_value_info(TOTAL_LENGTH, onnx.TensorProto.INT64, []))
    return TOTAL_LENGTH


def _branch_tables(node: onnx.NodeProto) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
    """An If's (then, else) output tables where each branch is only Constants of matching ranks, dtypes and
    trailing dimensions; else None."""
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    tables = []
    for key in ("then_branch", "else_branch"):
        graph = branches.get(key)
        if graph is None or graph.initializer or any(n.op_type != "Constant" for n in graph.node):
            return None
        values = {}
        for n in graph.node:
            value = [a for a in n.attribute if a.name == "value"]
            if not value:
                return None
            values[n.output[0]] = onnx.numpy_helper.to_array(value[0].t)
        if any(o.name not in values for o in graph.output):
            return None
        tables.append([values[o.name] for o in graph.output])
    for high, low in zip(*tables):
        if high.ndim < 1 or high.dtype != low.dtype or high.shape[1:] != low.shape[1:]:
            return None
    return tables[0], tables[1]


def _is_mask_width(name: str, producers: Mapping[str, onnx.NodeProto], constants: Mapping[str, np.ndarray],
                   attention_mask: str) -> bool:
    """Whether ``name`` is ``Gather(Shape(attention_mask), 1)`` (a scalar index 1), through Casts, as int64."""
    node = producers.get(name)
    while node is not None and node.op_type == "Cast":
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Gather" or len(node.input) < 2:
        return False
    index = constants.get(node.input[1])
    shape = producers.get(node.input[0])
    return (
        index is not None and index.shape == () and int(index) == 1
        and shape is not None and shape.op_type == "Shape" and shape.input[0] == attention_mask
        and not any(a.name in ("start", "end") for a in shape.attribute)
    )


def fill_total_length(input_names: Sequence[str], attention_mask: str, inputs: Sequence[Any],
                      named: Mapping[str, Any]) -> dict[str, Any]:
    """A call's named inputs with `TOTAL_LENGTH` filled in as the mask's width where the caller left it out
    (what the graph computed before :func:`feed_total_length`). Positional ``inputs`` bind first, in order."""
    named = dict(named)
    if TOTAL_LENGTH in named or len(inputs) >= len(input_names):
        return named
    positional = dict(zip(input_names, inputs))
    mask = named.get(attention_mask, positional.get(attention_mask))
    if mask is not None:
        named[TOTAL_LENGTH] = np.int64(np.shape(mask)[1])
    return named


__all__ = ["TOTAL_LENGTH", "feed_total_length", "fill_total_length", "mask_width_conditions"]
