"""The graph view behind the Megatron plan: producers, consumers, shapes, normalisations, walks.

`PlanGraph` indexes a model's main graph once: which node produces and which
nodes read each tensor, the initializers and constants, the shapes ONNX shape
inference finds (symbolic dims as their names), and which nodes are layer
boundaries (explicit or decomposed normalisations). Its walks are what the
plan's patterns are read from: `walk_back` finds the linears feeding a
tensor, `depends_on_input` tells token ids from positions.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping

import onnx

from sharding.op_facts import NORMALIZATIONS, SHAPE_READERS
from sharding.shapes import tensor_shapes

from sharding.megatron.builder import ATTENTION_OPS

_log = logging.getLogger(__name__)

# Ops that only carry shapes: a walk along values stops there.
_SHAPE_OPS = SHAPE_READERS | {"ConstantOfShape", "EyeLike"}
# Ops a norm's statistics flow through between the ReduceMean and the apply node.
_STAT_OPS = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Sqrt",
        "Reciprocal",
        "Pow",
        "Cast",
        "Identity",
        "Neg",
        "Max",
        "Min",
        "Clip",
    }
)
_ATTENTION_OPS = frozenset({"Softmax", "MatMul", "Einsum"}) | ATTENTION_OPS

Shape = tuple[int | str | None, ...]


class PlanGraph:
    """Producers, consumers, constants and inferred shapes of the main graph."""

    def __init__(self, model: onnx.ModelProto, shapes: Mapping[str, Shape] | None = None) -> None:
        """``shapes``: the model's inferred shapes when the caller has them (else shape inference runs here)."""
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits = {i.name: tuple(i.dims) for i in graph.initializer}
        self.init_protos = {i.name: i for i in graph.initializer}
        self.inputs = {i.name for i in graph.input} - set(self.inits)
        self.outputs = {o.name for o in graph.output}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        self.constants = set(self.inits)
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in node.input:
                if name:
                    self.consumers[name].append(index)
            if node.op_type == "Constant":
                self.constants.update(node.output)
        self.shapes = dict(shapes) if shapes is not None else self._infer_shapes(model)
        self.norm_nodes = self._norm_nodes()

    def _infer_shapes(self, model: onnx.ModelProto) -> dict[str, Shape]:
        shapes, diagnostics = tensor_shapes(model)  # the one shape inference (sharding.shapes)
        for diagnostic in diagnostics:  # shapes only refine the plan
            _log.info("%s; planning with the shapes known", diagnostic.message)
        return shapes

    def _norm_nodes(self) -> set[int]:
        """Explicit normalisations, and the nodes applying decomposed ones.

        A decomposed RMSNorm is ``x * Reciprocal(Sqrt(ReduceMean(x^2) + eps))``
        and a decomposed LayerNorm ``(x - ReduceMean(x)) / ...``: the apply node
        mixes a tensor with a value computed from a ReduceMean through
        statistics-only ops (constants as the other operands).
        """
        stats: set[str] = set()
        norms = set()
        for index, node in enumerate(self.nodes):
            if node.op_type in NORMALIZATIONS:
                norms.add(index)
                continue
            if node.op_type == "ReduceMean":
                stats.update(node.output)
                continue
            inputs = [i for i in node.input if i]
            if not any(i in stats for i in inputs):
                continue
            if node.op_type in _STAT_OPS and all(i in stats or i in self.constants for i in inputs):
                stats.update(node.output)
            else:
                norms.add(index)
        return norms

    def rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def walk_back(self, tensor: str, stop: set[int]) -> tuple[set[int], bool]:
        """Nodes of ``stop`` reached backwards from ``tensor``, and whether
        the walk crossed an attention op (Softmax, MatMul between activations).

        The walk stops at ``stop`` nodes, normalisations, shape-only ops and
        graph inputs/initializers.
        """
        found: set[int] = set()
        attention = False
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            index = self.producer.get(name)
            if index is None:
                continue
            if index in stop:
                found.add(index)
                continue
            node = self.nodes[index]
            if index in self.norm_nodes or node.op_type in _SHAPE_OPS:
                continue
            if node.op_type in _ATTENTION_OPS:
                attention = True
            stack.extend(i for i in node.input if i)
        return found, attention

    def depends_on_input(self, tensor: str) -> bool:
        """Whether a tensor's values depend on a model input (not only its shape)."""
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.inputs:
                return True
            index = self.producer.get(name)
            if index is None or self.nodes[index].op_type in _SHAPE_OPS:
                continue
            stack.extend(i for i in self.nodes[index].input if i)
        return False


