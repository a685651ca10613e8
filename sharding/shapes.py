"""Shapes of a model's tensors and a topological order of its nodes: one routine each, jax-free.

:func:`infer_model` runs ONNX shape inference (``data_prop=True``) on a light
copy of the model: initializers above ``CONSTANT_LIMIT`` elements (or held in
external data) become typed graph inputs, so inference never copies weights
and data propagation still sees the small constants (shape tuples, axes).
Its :class:`InferredModel` gives the shapes (:func:`tensor_shapes`), each
tensor's ValueInfo (what a graph partition types its parts' inputs with) and
the inferred nodes (an If's branches). Validation, sharding inference, the
partitions (stages, segments) and the Megatron planner all read shapes from
here, so that a compile runs it once on the whole model.

:func:`topological_order` is the one order of a graph's nodes: producers
first (outer-scope names that subgraphs read count as inputs), graph order
among ready nodes; a cycle raises, naming its nodes.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Iterator, Mapping, Sequence

import onnx
import onnx.shape_inference

from sharding import codes
from sharding.diagnostics import Diagnostic
from sharding.model_arg import ModelLoadError

Dim = int | str | None
Shape = tuple[Dim, ...]  # as sharding.rules.base.Shape: ints, symbols or None per axis

CONSTANT_LIMIT = 4096  # elements: larger initializers are typed inputs for shape inference


def _dims(type_proto: onnx.TypeProto) -> Shape | None:
    if type_proto.WhichOneof("value") != "tensor_type":
        return None
    tensor = type_proto.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(_dim(d) for d in tensor.shape.dim)


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    which = d.WhichOneof("value")
    return d.dim_value if which == "dim_value" else (d.dim_param or None) if which else None


def _light_copy(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int | str]] | None,
    order: Sequence[int] | None = None,
) -> onnx.ModelProto:
    """A copy for shape inference: large initializers become typed graph inputs."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    source = model.graph
    if order is None:
        order = topological_order(source)
    if list(order) == list(range(len(source.node))):
        graph.node.extend(source.node)
    else:
        graph.node.extend(source.node[i] for i in order)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    declared = {i.name for i in source.input}
    for init in source.initializer:
        if math.prod(init.dims) <= CONSTANT_LIMIT and init.data_location != onnx.TensorProto.EXTERNAL:
            graph.initializer.append(init)
        elif init.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    for sparse in source.sparse_initializer:
        if sparse.values.name not in declared:
            graph.input.append(
                onnx.helper.make_tensor_value_info(sparse.values.name, sparse.values.data_type, list(sparse.dims))
            )
    for name, dims in (input_shapes or {}).items():
        for info in graph.input:
            if info.name == name:
                shape = info.type.tensor_type.shape
                shape.ClearField("dim")
                for d in dims:
                    if isinstance(d, str):
                        shape.dim.add().dim_param = d  # a symbolic size (jax.export's batch): a name
                    else:
                        shape.dim.add().dim_value = int(d)
    return light


@dataclasses.dataclass(frozen=True)
class InferredModel:
    """The result of one ONNX shape inference of a model.

    Attributes:
        graph: the light copy's graph after inference (its value_info typed).
        order: ``graph.node[k]`` is the model's node ``order[k]``.
        shapes: ``{tensor: shape}`` (ints, symbols or None per axis), initializers included.
        diagnostics: a ``shape-inference-failed`` warning, when inference failed.
    """

    graph: onnx.GraphProto
    order: tuple[int, ...]
    shapes: Mapping[str, Shape]
    diagnostics: tuple[Diagnostic, ...]

    def node(self, index: int) -> onnx.NodeProto:
        """The inferred copy of the model's node ``index`` (an If's branches typed)."""
        return self.graph.node[self.order.index(index)]

    def value_types(self, model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
        """Every tensor's ValueInfo: inferred, else as ``model`` declares it (initializers excluded)."""
        inits = {i.name for i in model.graph.initializer}
        types = {}
        for info in (*self.graph.value_info, *self.graph.output, *self.graph.input):
            if info.name not in inits:
                types[info.name] = info
        for info in (*model.graph.value_info, *model.graph.input, *model.graph.output):
            if info.type.HasField("tensor_type") and info.type.tensor_type.elem_type:
                types.setdefault(info.name, info)
        return types


def infer_model(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    order: Sequence[int] | None = None,
) -> InferredModel:
    """ONNX shape inference (``data_prop=True``) of the main graph, on a light copy.

    Args:
        model: The model; not modified.
        input_shapes: Dims for model inputs, replacing the declared ones: ints, or names (dim_params)
            for sizes a call leaves symbolic (a batch under jax.export).
        order: The nodes' topological order, if already known.

    Raises:
        ModelLoadError: the graph has a cycle (naming its nodes).
    """
    order = tuple(topological_order(model.graph) if order is None else order)
    diags = []
    light = _light_copy(model, input_shapes, order)
    try:
        graph = onnx.shape_inference.infer_shapes(light, strict_mode=True, data_prop=True).graph
    except Exception as e:  # onnx raises several types (InferenceError, ValidationError, RuntimeError)
        try:  # what can be inferred despite the error
            graph = onnx.shape_inference.infer_shapes(light, data_prop=True).graph
        except Exception:
            graph = light.graph
        diags.append(
            Diagnostic(
                code=codes.SHAPE_INFERENCE_FAILED,
                severity="warning",
                message=f"ONNX shape inference failed ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                "shapes may be missing or wrong",
                hint="fix the model's types, or give input_shapes",
            )
        )
    shapes: dict[str, Shape] = {}
    for info in (*graph.value_info, *graph.input, *graph.output):
        dims = _dims(info.type)
        if dims is not None:
            shapes[info.name] = dims
    for init in model.graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return InferredModel(graph, order, shapes, tuple(diags))


def tensor_shapes(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    order: Sequence[int] | None = None,
) -> tuple[dict[str, Shape], list[Diagnostic]]:
    """Shapes of the main graph's tensors after ONNX shape inference (:func:`infer_model`).

    Returns:
        ``{tensor: shape}`` and any diagnostics (a failed inference is a
        warning; the model's own value_info is used then).
    """
    inferred = infer_model(model, input_shapes, order)
    return dict(inferred.shapes), list(inferred.diagnostics)


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The node's subgraphs (If's branches, Loop's and Scan's bodies)."""
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph reads from enclosing scopes."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        for sub in subgraphs(node):
            used |= _outer_names(sub)
        defined.update(n for n in node.output if n)
    return used - defined


def node_inputs(node: onnx.NodeProto) -> list[str]:
    """A node's inputs, including the outer-scope names its subgraphs read."""
    names = [n for n in node.input if n]
    for sub in subgraphs(node):
        names += sorted(_outer_names(sub) - set(names))
    return names


def topological_order(graph: onnx.GraphProto | Sequence[onnx.NodeProto]) -> list[int]:
    """Node indices with producers first, graph order among ready nodes (stored order when it is one).

    Raises:
        ModelLoadError (a ValueError): the graph has a cycle, naming (up to ten of) its nodes.
    """
    nodes = graph.node if isinstance(graph, onnx.GraphProto) else graph
    producer: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.output:
            if name:
                producer[name] = index
    reads = [node_inputs(node) for node in nodes]
    if all(producer.get(name, -1) < index for index, names in enumerate(reads) for name in names):
        return list(range(len(nodes)))
    pending = {}
    users: dict[int, list[int]] = {}
    for index, names in enumerate(reads):
        deps = {producer[n] for n in names if n in producer and producer[n] != index}
        pending[index] = len(deps)
        for dep in deps:
            users.setdefault(dep, []).append(index)
    ready = [i for i, count in pending.items() if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users.get(index, ()):
            pending[user] -= 1
            if pending[user] == 0:
                heapq.heappush(ready, user)
    if len(order) != len(nodes):
        done = set(order)
        stuck = [nodes[i].name or f"#{i}" for i in range(len(nodes)) if i not in done]
        raise ModelLoadError(f"the graph has a cycle through nodes {stuck[:10]}: ONNX graphs are acyclic (a loop is a Loop node)")
    return order


__all__ = ["CONSTANT_LIMIT", "InferredModel", "infer_model", "node_inputs", "subgraphs", "tensor_shapes", "topological_order"]
