"""The LM head applied only at the positions a generation step reads (each row's last real token).

A decoder's graph computes logits ``[batch, sequence, vocabulary]`` at every position of its input; a
generation loop reads one position per row (the prompt's last real token at the prefill, the new token at a
decode step). At the prefill of a 128-token prompt the vocabulary projection of the 127 other positions is
~30% of GPT-2 small's work (50,257 x 768 per position) and a ``[batch, 128, vocabulary]`` buffer.

:func:`gather_logit_positions` finds the LM head structurally: from the logits output back through
position-wise ops with constant operands of rank 0 or 1 (a bias Add, Cast, gemma2's soft-capping
Div/Tanh/Mul, granite's scaling Mul) to a ``MatMul`` (or ``com.microsoft.MatMulNBits``) whose weight is
computed from constants alone and whose hidden-state input therefore has the logits' rank 3. It inserts
``GatherND(hidden, LOGIT_POSITIONS, batch_dims=1)`` before that product, `LOGIT_POSITIONS` being a new graph
input ``int64 [batch, positions, 1]``: the positions are data, per row, so a right-padded batch reads each
row's own last real position and one program serves every prompt length of a bucket. The logits output
becomes ``[batch, positions, vocabulary]``.

The generation programs feed the positions they read (:mod:`onnx2jax.runtime.decoder`); a plain call of the
model (the handle's ``__call__``/``apply``, serving) gets every position (:func:`fill_logit_positions`), so
that it computes what the graph computed. A graph where no such head is found is left as it is.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import onnx

LOGIT_POSITIONS = "onnx2jax.logit_positions"
"""The graph input :func:`gather_logit_positions` adds: per row, the positions whose logits are computed
(int64 ``[batch, positions, 1]``)."""

_POSITION_WISE = frozenset({"Add", "Sub", "Mul", "Div", "Tanh", "Cast", "Identity", "Sigmoid", "Softcap"})
"""Ops that compute each position from that position alone (with constant operands of rank 0 or 1)."""

_HEADS = {("", "MatMul"), ("com.microsoft", "MatMulNBits")}
"""A vocabulary projection: the hidden states times a constant weight."""

_WEIGHT_VIEWS = frozenset({"Transpose", "Cast", "Identity", "DequantizeLinear"})
"""Ops a constant weight may go through before the product (a tied head's transposed table)."""


def lm_head(graph: onnx.GraphProto, logits: str) -> onnx.NodeProto | None:
    """The product that projects hidden states onto the vocabulary for output ``logits`` (see the module
    docstring), or None where the graph has no such structure."""
    outputs = {o.name: o for o in graph.output}
    if logits not in outputs or len(outputs[logits].type.tensor_type.shape.dim) != 3:
        return None
    producers = {out: node for node in graph.node for out in node.output if out}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    ranks = _constant_ranks(graph)
    name = logits
    while True:
        node = producers.get(name)
        if node is None:
            return None
        if consumers.get(name, 0) != (0 if name == logits else 1) or (name != logits and name in outputs):
            return None  # another reader would see the gathered positions
        key = (node.domain or "", node.op_type)
        if key in _HEADS:
            weight = _weight_rank(node.input[1], producers, ranks) if len(node.input) > 1 else None
            if key == ("", "MatMul") and weight != 2:
                return None
            if key != ("", "MatMul") and node.input[1] not in ranks:
                return None
            return node
        if node.domain not in ("", "ai.onnx") or node.op_type not in _POSITION_WISE:
            return None
        flowing = [i for i in node.input if i and i not in ranks]
        if len(flowing) != 1 or any(ranks[i] > 1 for i in node.input if i and i in ranks):
            return None
        name = flowing[0]


def gather_logit_positions(model: onnx.ModelProto, logits: str) -> str | None:
    """Rewrites ``model``'s graph in place so that its LM head (:func:`lm_head`) projects only the positions
    fed as `LOGIT_POSITIONS` (a graph input added last). Returns `LOGIT_POSITIONS`, or None where no head was
    found or the model's opset has no ``GatherND`` with ``batch_dims`` (before 12): the graph untouched."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    head = lm_head(graph, logits) if opset >= 12 else None
    if head is None:
        return None
    hidden = head.input[0]
    gathered = f"{hidden}/at_logit_positions"
    gather = onnx.helper.make_node("GatherND", [hidden, LOGIT_POSITIONS], [gathered], batch_dims=1,
                                   name=f"{head.name or hidden}/logit_positions")
    head.input[0] = gathered
    graph.node.insert(list(graph.node).index(head), gather)
    output = next(o for o in graph.output if o.name == logits)
    dims = output.type.tensor_type.shape.dim
    batch = onnx.TensorShapeProto.Dimension()
    batch.CopyFrom(dims[0])
    dims[1].Clear()
    dims[1].dim_param = "logit_positions"
    graph.input.append(onnx.helper.make_tensor_value_info(LOGIT_POSITIONS, onnx.TensorProto.INT64, [None, "logit_positions", 1]))
    graph.input[-1].type.tensor_type.shape.dim[0].CopyFrom(batch)
    return LOGIT_POSITIONS


def every_position(batch: int, width: int) -> np.ndarray:
    """`LOGIT_POSITIONS` for every position of a ``[batch, width]`` input (the graph's own logits)."""
    return np.broadcast_to(np.arange(width, dtype=np.int64)[None, :, None], (batch, width, 1))


def fill_logit_positions(input_names: Sequence[str], input_ids: str, inputs: Sequence[Any],
                         named: Mapping[str, Any]) -> dict[str, Any]:
    """A call's named inputs with `LOGIT_POSITIONS` filled in as every position of ``input_ids`` where the
    caller left it out (what the graph computed before :func:`gather_logit_positions`). Positional ``inputs``
    bind first, in order."""
    named = dict(named)
    if LOGIT_POSITIONS in named or len(inputs) >= len(input_names):
        return named
    ids = named.get(input_ids, dict(zip(input_names, inputs)).get(input_ids))
    if ids is not None and np.ndim(ids) == 2:
        named[LOGIT_POSITIONS] = every_position(*np.shape(ids))
    return named


def _constant_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """The rank of every tensor held as a constant (initializers and Constant nodes)."""
    ranks = {init.name: len(init.dims) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    ranks[node.output[0]] = len(attribute.t.dims)
                elif attribute.name in ("value_float", "value_int"):
                    ranks[node.output[0]] = 0
                elif attribute.name in ("value_floats", "value_ints"):
                    ranks[node.output[0]] = 1
    return ranks


def _weight_rank(name: str, producers: Mapping[str, onnx.NodeProto], ranks: Mapping[str, int]) -> int | None:
    """The rank of a weight computed from one constant through `_WEIGHT_VIEWS` (None: not such a weight)."""
    while name not in ranks:
        node = producers.get(name)
        if node is None or node.op_type not in _WEIGHT_VIEWS or not node.input:
            return None
        name = node.input[0]
    return ranks[name]


__all__ = ["LOGIT_POSITIONS", "every_position", "fill_logit_positions", "gather_logit_positions", "lm_head"]
