"""Which graph inputs index a table, and a host-side check of a call's values against those tables (jax-free).

XLA does not refuse out-of-range gather indices (it clamps them or fills
NaN, and drops out-of-range scatter updates), so a token id beyond the
vocabulary gives an answer where onnxruntime refuses with ``indices element out of data bounds``. This
module finds, once per model, every graph input whose values reach the
indices of a ``Gather``, ``GatherElements``, ``GatherND``, ``ScatterElements``
or ``ScatterND`` (directly or through ops that keep the values: ``Cast``,
``Reshape``, ``Unsqueeze`` ...), with the size each index may address; and
:func:`check` refuses a call's values outside ``[-size, size)`` (ONNX allows
negative indices, counted from the end), naming the input, the position, the
value and the bound.

Only tables whose indexed size is known from the model (an initializer, a
``Constant``, a declared or inferred static shape) are checked. The check
costs one ``min``/``max`` per checked input on the host; callers that feed
ids known to be in range turn it off (``translate(..., check_indices=False)``,
``onnx2jax run --no-check-indices``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.helper
import onnx.shape_inference

from onnx2jax.errors import InputRangeError

# Ops through which each element keeps its value (the layout may change): an input reaching a
# Gather's indices through them still holds those indices.
_ELEMENTWISE_KEEPING = {"Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose"}
# Ops that keep the values and the layout: the only ones followed to GatherND/ScatterND, whose
# indices' last axis is a coordinate vector that a Reshape would regroup.
_LAYOUT_KEEPING = {"Cast", "Identity"}
_GATHER_ND_LIKE = {"GatherND", "ScatterND"}
# Ops whose input 1 indexes their input 0.
_INDEXING_OPS = {"Gather", "GatherElements", "ScatterElements"} | _GATHER_ND_LIKE
_INFER_LIMIT_BYTES = 64 << 20  # beyond this, no whole-model shape inference just for the check


@dataclasses.dataclass(frozen=True)
class IndexUse:
    """One graph input reaching the indices of one node.

    Attributes:
      input: the graph input's name.
      node: the indexing node's name (or ``op_type#position`` when unnamed).
      op: its op_type.
      table: the tensor it indexes (the data input).
      bounds: the size each index may address. One entry for Gather-like ops
        (the indexed axis); for GatherND/ScatterND one per component of the
        indices' last axis (the data's axes from ``batch_dims`` on).
    """

    input: str
    node: str
    op: str
    table: str
    bounds: tuple[int, ...]


class IndexCheck:
    """A model's index check, as its callers hold it: analysed on the first call, skipped when disabled.

    ``JaxModel`` and the compiled executions hold one and call :meth:`call`
    with each call's arguments; ``enabled = False`` (``translate(...,
    check_indices=False)``) turns the check off for inputs known to be in range.
    """

    def __init__(self, proto: onnx.ModelProto, input_names: list[str], *, enabled: bool = True):
        self.enabled = enabled
        self._proto, self._names = proto, tuple(input_names)
        self._uses: list[IndexUse] | None = None

    @property
    def uses(self) -> list[IndexUse]:
        """The model's index inputs (:func:`index_uses`), found once."""
        if self._uses is None:
            self._uses = index_uses(self._proto)
        return self._uses

    def call(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> None:
        """Checks one call's positional and named arguments (:func:`check`), unless disabled.

        Raises:
          InputRangeError: an index input addresses beyond its table.
        """
        if not self.enabled or not self.uses:
            return
        bound = dict(zip(self._names, inputs))
        bound.update(named)
        check(self.uses, bound)


def index_uses(proto: onnx.ModelProto) -> list[IndexUse]:
    """Every graph input whose values index a table of known size, once per (input, node), in graph order."""
    graph = proto.graph
    initialized = {t.name for t in graph.initializer}
    readers: dict[str, list[tuple[int, onnx.NodeProto]]] = {}
    for position, node in enumerate(graph.node):
        for name in node.input:
            readers.setdefault(name, []).append((position, node))
    shapes = _ShapeSource(proto)
    uses: list[IndexUse] = []
    for info in graph.input:
        if info.name in initialized:
            continue
        # (tensor, whether the path so far kept the layout)
        frontier, seen = [(info.name, True)], set()
        while frontier:
            tensor, layout_kept = frontier.pop()
            if (tensor, layout_kept) in seen:
                continue
            seen.add((tensor, layout_kept))
            for position, node in readers.get(tensor, ()):
                op = node.op_type if node.domain in ("", "ai.onnx") else None
                if op in _INDEXING_OPS and len(node.input) > 1 and node.input[1] == tensor:
                    if op in _GATHER_ND_LIKE and not layout_kept:
                        continue
                    bounds = _bounds(node, shapes)
                    if bounds:
                        name = node.name or f"{node.op_type}#{position}"
                        uses.append(IndexUse(info.name, name, node.op_type, node.input[0], bounds))
                elif op in _ELEMENTWISE_KEEPING and node.input[0] == tensor:
                    frontier.extend((out, layout_kept and op in _LAYOUT_KEEPING) for out in node.output if out)
    return uses


def check(uses: list[IndexUse], inputs: Mapping[str, Any]) -> None:
    """Refuses a call whose index inputs address beyond their tables.

    Values that are not concrete (jax tracers) are skipped: only a call's
    actual arrays can be checked.

    Raises:
      InputRangeError: naming the first out-of-range element: input,
        position, value, the allowed range, the node and the table.
    """
    for use in uses:
        value = inputs.get(use.input)
        if value is None:
            continue
        try:
            array = np.asarray(value)
        except Exception:  # noqa: BLE001 - a tracer (under jit): nothing concrete to check
            continue
        if array.dtype.kind not in "iu" or array.size == 0:
            continue
        if len(use.bounds) == 1:
            _check_axis(use, array, array, use.bounds[0], None)
        elif array.ndim >= 1 and array.shape[-1] <= len(use.bounds):
            for component in range(array.shape[-1]):
                _check_axis(use, array, array[..., component], use.bounds[component], component)


def _check_axis(use: IndexUse, whole: np.ndarray, values: np.ndarray, size: int, component: int | None) -> None:
    low, high = values.min(), values.max()
    if low >= -size and high < size:
        return
    bad = np.argwhere((values < -size) | (values >= size))[0]
    position = tuple(int(i) for i in bad) + (() if component is None else (component,))
    value = int(values[tuple(bad)])
    raise InputRangeError(use.input, position, value, size, use.node, use.op, use.table, component)


def _bounds(node: onnx.NodeProto, shapes: _ShapeSource) -> tuple[int, ...]:
    """The sizes ``node``'s indices may address, or () when the data's shape is not known."""
    shape = shapes.shape(node.input[0])
    if shape is None:
        return ()
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type in _GATHER_ND_LIKE:
        batch = int(attrs.get("batch_dims", 0))
        dims = shape[batch:]
        if not dims or any(d is None for d in dims):
            return ()
        return tuple(dims)
    axis = int(attrs.get("axis", 0))
    if not -len(shape) <= axis < len(shape):
        return ()
    size = shape[axis]
    return (size,) if size is not None else ()


class _ShapeSource:
    """Static shapes of a model's tensors: initializers, Constants, declared value_info; inference if needed."""

    def __init__(self, proto: onnx.ModelProto):
        self._proto = proto
        graph = proto.graph
        self._known: dict[str, tuple[int | None, ...]] = {t.name: tuple(t.dims) for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        self._known[node.output[0]] = tuple(attr.t.dims)
        self._declared = _declared_shapes(list(graph.input) + list(graph.value_info) + list(graph.output))
        self._inferred: dict[str, tuple[int | None, ...]] | None = None

    def shape(self, name: str) -> tuple[int | None, ...] | None:
        if name in self._known:
            return self._known[name]
        if name in self._declared:
            return self._declared[name]
        if self._inferred is None:
            self._inferred = self._infer()
        return self._inferred.get(name)

    def _infer(self) -> dict[str, tuple[int | None, ...]]:
        if self._proto.ByteSize() > _INFER_LIMIT_BYTES:
            return {}
        try:
            inferred = onnx.shape_inference.infer_shapes(self._proto)
        except Exception:  # noqa: BLE001 - no inferred shape means no check, never a failure
            return {}
        return _declared_shapes(inferred.graph.value_info)


def _declared_shapes(infos) -> dict[str, tuple[int | None, ...]]:
    shapes: dict[str, tuple[int | None, ...]] = {}
    for info in infos:
        tensor = info.type.tensor_type
        if info.type.HasField("tensor_type") and tensor.HasField("shape"):
            shapes[info.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
    return shapes
