"""Which initializers of an ONNX model are parameters to train, and which are constants of the graph.

An exported model keeps everything it does not compute from its inputs as an
initializer: the weights of its layers, but also shape and index tensors,
folded scalars (an epsilon, a scale, a mask's fill value), rotary frequency
tables and masks. Only the first are the model's parameters. The rule
(:func:`trainable_names`), on the ModelProto alone (no jax):

An initializer is **trainable** when all of these hold:

1. its type is floating (float16, bfloat16, float32, float64);
2. it has more than one element: single values are folded scalars
   (epsilons, exponents, attention scales, fill values), not weights;
3. its values are finite and none is a mask fill (``|x| >= 1e30``: ``-inf``,
   ``finfo(float32).min`` in additive causal masks);
4. it reaches a graph output along a differentiable path: a forward walk from
   it that enters a node only through an input that carries a gradient (not a
   shape, size, index, scale or cache slot: :data:`NON_DIFFERENTIABLE_INPUTS`),
   continues only through floating outputs (a comparison, a Shape, an integer
   Cast end it), and does not continue through ``Sin``/``Cos`` (a tensor all of
   whose paths go through a sine or cosine is a rotary or sinusoidal frequency
   table: ``inv_freq``).

Everything else is a constant. The rule is a default: ``onnx2jax.compile(...,
trainable=names)`` or ``Compiled.with_trainable(names)`` override it (a
sinusoidal network whose weights feed ``Sin`` needs that).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from onnx2jax.errors import ParameterError

#: Per op type, the input positions that carry no gradient (shapes, sizes,
#: axes, indices, scales, rotary caches); None: none of its inputs does.
NON_DIFFERENTIABLE_INPUTS: Mapping[str, frozenset[int] | None] = {
    "Shape": None,
    "Size": None,
    "Range": None,
    "ConstantOfShape": None,
    "EyeLike": None,
    "RandomNormalLike": None,
    "RandomUniformLike": None,
    "Bernoulli": None,
    "Multinomial": None,
    "NonZero": None,
    "ArgMax": None,
    "ArgMin": None,
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Pad": frozenset({1, 3}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "TopK": frozenset({1}),
    "OneHot": frozenset({0, 1}),
    "Dropout": frozenset({1, 2}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "ScatterND": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "Where": frozenset({0}),
    "RotaryEmbedding": frozenset({1, 2, 3}),
    "GroupQueryAttention": frozenset({4, 5, 6, 7, 8}),
}

#: Ops whose outputs do not carry the walk on: frequency tables end here.
FREQUENCY_OPS = frozenset({"Sin", "Cos"})

#: A value this large is a mask fill, not a weight.
MASK_FILL = 1e30

_FLOATING = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE,
    }
)


def _subgraph_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If, Loop, Scan bodies) read from the enclosing scope."""
    names: set[str] = set()
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else list(attribute.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names |= _subgraph_names(inner)
    return names


def _floating_outputs(model: onnx.ModelProto) -> dict[str, bool]:
    """Whether each value named in the model is floating, where shape inference or the graph says."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=False).graph
    except Exception:  # noqa: BLE001 - inference is a help here, not a requirement
        inferred = model.graph
    floating = {}
    for info in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        if info.type.HasField("tensor_type"):
            floating[info.name] = info.type.tensor_type.elem_type in _FLOATING
    for tensor in model.graph.initializer:
        floating[tensor.name] = tensor.data_type in _FLOATING
    return floating


def _differentiable_reach(model: onnx.ModelProto, start: str, floating: Mapping[str, bool], readers) -> bool:
    """Whether a forward differentiable walk from ``start`` reaches a graph output."""
    outputs = {o.name for o in model.graph.output}
    seen, frontier = {start}, [start]
    while frontier:
        name = frontier.pop()
        if name in outputs:
            return True
        for node, position in readers.get(name, ()):
            blocked = NON_DIFFERENTIABLE_INPUTS.get(node.op_type, frozenset())
            if blocked is None or (position is not None and position in blocked) or node.op_type in FREQUENCY_OPS:
                continue
            for out in node.output:
                if out and out not in seen and floating.get(out, True):
                    seen.add(out)
                    frontier.append(out)
    return False


def _weight_like(tensor: onnx.TensorProto, values: Mapping[str, np.ndarray] | None) -> bool:
    """Rules 1-3: floating, more than one element, finite and no mask fill."""
    if tensor.data_type not in _FLOATING or int(np.prod(tensor.dims)) <= 1:
        return False
    array = values[tensor.name] if values is not None and tensor.name in values else numpy_helper.to_array(tensor)
    array = np.asarray(array, dtype=np.float64)
    return bool(np.all(np.isfinite(array)) and np.max(np.abs(array)) < MASK_FILL)


def trainable_names(model: onnx.ModelProto, values: Mapping[str, np.ndarray] | None = None) -> tuple[str, ...]:
    """The model's trainable initializers by the module's rule, in initializer order.

    ``values``: the initializers' arrays by name where the proto holds them as
    external data (a loaded ``JaxModel``'s ``params`` and ``constants``);
    otherwise they are read from ``model``.
    """
    readers: dict[str, list[tuple[onnx.NodeProto, int | None]]] = {}
    for node in model.graph.node:
        for position, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((node, position))
        for name in _subgraph_names(node):
            readers.setdefault(name, []).append((node, None))
    floating = _floating_outputs(model)
    return tuple(
        t.name
        for t in model.graph.initializer
        if _weight_like(t, values) and _differentiable_reach(model, t.name, floating, readers)
    )


def checked_names(names: Iterable[str], known: Mapping[str, Any] | Iterable[str], caller: str) -> tuple[str, ...]:
    """``names`` as given, after checking each is a known parameter (``caller`` names the call in the message).

    Raises:
      ParameterError: a name is not one of ``known`` (:func:`unknown_parameters` says which, and what is near).
    """
    names = tuple(names)
    known = known if isinstance(known, Mapping) else dict.fromkeys(known)
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ParameterError(f"{caller}: {unknown_parameters(unknown, known)}")
    return names


def unknown_parameters(names: Iterable[str], known: Mapping[str, Any]) -> str:
    """Each of ``names`` said not to be a parameter, with the parameters its spelling is closest to."""
    parts = []
    for name in sorted(set(names)):
        near = difflib.get_close_matches(name, list(known), n=2)
        parts.append(f"{name!r} is not a parameter of this model" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near else ""))
    listed = ", ".join(sorted(known)[:8]) + (", ..." if len(known) > 8 else "")
    return f"{'; '.join(parts)}; its {len(known)} parameters: {listed}"


__all__ = [
    "FREQUENCY_OPS", "MASK_FILL", "NON_DIFFERENTIABLE_INPUTS", "checked_names", "trainable_names", "unknown_parameters",
]
