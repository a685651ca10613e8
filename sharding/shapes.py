"""Shapes of a model's tensors and a topological order of its nodes: one routine each, jax-free.

``tensor_shapes`` runs ONNX shape inference (``data_prop=True``) on a light
copy of the model: initializers above ``CONSTANT_LIMIT`` elements (or held in
external data) become typed graph inputs, so inference never copies weights
and data propagation still sees the small constants (shape tuples, axes).
Validation, inference, the stage cut and the Megatron planner all read
shapes from here, so that a compile runs it once.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence

import onnx
import onnx.shape_inference

from sharding.diagnostics import Diagnostic
from sharding.rules.core import Shape

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
    input_shapes: Mapping[str, Sequence[int]] | None,
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
    for name, dims in (input_shapes or {}).items():
        for info in graph.input:
            if info.name == name:
                shape = info.type.tensor_type.shape
                shape.ClearField("dim")
                for d in dims:
                    shape.dim.add().dim_value = int(d)
    return light


def tensor_shapes(
    model: onnx.ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    order: Sequence[int] | None = None,
) -> tuple[dict[str, Shape], list[Diagnostic]]:
    """Shapes of the main graph's tensors after ONNX shape inference (``data_prop=True``).

    Args:
        model: The model (a ModelProto, a path, bytes or an onnx_ir.Model); not modified.
        input_shapes: Concrete dims for model inputs, replacing symbolic ones.
        order: The nodes' topological order, if already known.

    Returns:
        ``{tensor: shape}`` and any diagnostics (a failed inference is a
        warning; the model's own value_info is used then).
    """
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
                code="shape-inference-failed",
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
    return shapes, diags


def topological_order(graph: onnx.GraphProto) -> list[int]:
    """Node indices in an order where producers come first (stored order when it is one)."""
    produced = {}
    for index, node in enumerate(graph.node):
        for name in node.output:
            if name:
                produced[name] = index
    ok = all(
        produced.get(name, -1) < index
        for index, node in enumerate(graph.node)
        for name in node.input
        if name
    )
    if ok:
        return list(range(len(graph.node)))
    waiting = [0] * len(graph.node)
    users = collections.defaultdict(list)
    for index, node in enumerate(graph.node):
        deps = {produced[n] for n in node.input if n in produced and produced[n] != index}
        waiting[index] = len(deps)
        for dep in deps:
            users[dep].append(index)
    ready = collections.deque(i for i, w in enumerate(waiting) if w == 0)
    order = []
    while ready:
        index = ready.popleft()
        order.append(index)
        for user in users[index]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    order += [i for i in range(len(graph.node)) if i not in set(order)]  # cycles: stored order
    return order


__all__ = ["CONSTANT_LIMIT", "tensor_shapes", "topological_order"]
