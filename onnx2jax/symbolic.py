"""Shape values that hold jax's symbolic dimensions (``jax.export`` shape polymorphism), while tracing.

The translator folds shape chains (Shape -> Gather -> Concat -> Reshape) into
values known while tracing, so that Reshape, Expand, Slice and Range get
static arguments (:mod:`onnx2jax.graph_runner`). Under ``jax.export`` with a
symbolic batch, ``x.shape`` holds a ``DimExpr`` (``batch``), which is no int64.
Such a shape value is a numpy *object* array of ints and ``DimExpr``s here: it
is still static (its structure is known while tracing; jax's reshape and
broadcast take ``DimExpr`` sizes), only some of its elements are symbolic.

Two kinds of values follow from that, and an op must not confuse them:

- a *symbolic shape value*: a small object array (a shape, a dim, a sum of
  dims), made by Shape and carried through the shape-chain ops here
  (:func:`fold`) with numpy on the objects, ``DimExpr`` arithmetic exact;
- a *tensor with a symbolic shape* (``Range(0, batch)``, ``ConstantOfShape
  ([batch, 8])``, ``Expand(x, [batch, 1, 8, 8])``): no numpy array can hold it,
  so the op runs with jax (the graph runner, :func:`as_jax`) and the result is
  traced like any activation.

A comparison whose answer depends on the symbolic value (``Equal(batch, 1)``,
a Max that cannot be decided, a Where on it) raises a :class:`NodeError`
naming the node: it is never guessed. Without symbolic dimensions nothing
here runs (the graph runner asks :func:`is_symbolic` first).
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def is_dim(value: Any) -> bool:
    """Whether ``value`` is one of jax's symbolic dimensions (a ``DimExpr``, not a constant)."""
    return jax.export.is_symbolic_dim(value)


def is_symbolic(value: Any) -> bool:
    """A static value that holds a symbolic dimension: an object array with a ``DimExpr`` in it.

    (String tensors are object arrays too; they hold no ``DimExpr``.)
    """
    return isinstance(value, np.ndarray) and value.dtype == object and any(is_dim(v) for v in value.flat)


def has_dims(shape: Sequence[Any]) -> bool:
    """Whether a shape (or a list of sizes) holds a symbolic dimension."""
    return any(is_dim(d) for d in shape)


def named_shape(shape: Sequence[Any]) -> tuple:
    """A shape for the jax-free sharding analyses: ints, and each symbolic dimension as its name
    (``str(DimExpr)``: ``batch``, ``2*batch``), which shape inference writes as a dim_param."""
    return tuple(str(d) if is_dim(d) else int(d) for d in shape)


def value(items: Any, dtype: Any = np.int64) -> np.ndarray:
    """A shape value from ints and ``DimExpr``s: ``dtype`` when all are ints, an object array otherwise.

    Accepts anything numpy can shape (a tuple of dims, an object array), so that
    a result whose symbolic elements cancelled (``batch - batch``) becomes a
    plain integer array again.
    """
    array = np.empty(np.shape(items), dtype=object)
    array[...] = items  # keeps DimExprs as objects (np.asarray would try to make them arrays)
    dtype = np.int64 if np.dtype(dtype) == object else dtype
    if not any(is_dim(v) for v in array.flat):
        return np.asarray(array.tolist() if array.ndim else array.item(), dtype=dtype)
    flat = [v if is_dim(v) else int(v) for v in array.flat]
    out = np.empty(len(flat), dtype=object)
    out[:] = flat
    return out.reshape(array.shape)


def dims(values: Any) -> list[Any]:
    """A static shape-setting input (a Reshape's shape, a Slice's ends) as ints and ``DimExpr``s."""
    return [v if is_dim(v) else int(v) for v in np.asarray(values).reshape(-1)]


def as_jax(array: np.ndarray) -> jax.Array:
    """A symbolic shape value as a traced jax integer array (``DimExpr``s become their runtime values).

    int64 as ONNX has it, or int32 where 64-bit types are off (jax narrows any int64 so).
    """
    dtype = jnp.int64 if jax.config.jax_enable_x64 else jnp.int32
    flat = [jnp.asarray(v).astype(dtype) for v in array.flat]
    return jnp.stack(flat).reshape(array.shape) if flat else jnp.zeros(array.shape, dtype)


def as_jax_inputs(inputs: Sequence[Any], static_positions: Sequence[int]) -> list:
    """``inputs`` with each symbolic value outside the op's static positions made a jax array."""
    return [as_jax(v) if i not in static_positions and is_symbolic(v) else v for i, v in enumerate(inputs)]


def broadcast_shapes(*shapes: Sequence[Any]) -> tuple:
    """numpy's broadcast of shapes that may hold ``DimExpr``s.

    A constant 1 stretches to the other size, whatever it is (``batch`` against 1
    is ``batch``, right also where batch is 1); two sizes must otherwise be equal
    for every value of the symbolic dimensions (``batch`` and ``batch``).

    Raises:
      ValueError: two sizes neither equal nor 1, or equal only for some values of a symbolic dimension.
    """
    rank = max(len(s) for s in shapes)
    out: list[Any] = [1] * rank
    for shape in shapes:
        for i, d in enumerate(shape, start=rank - len(shape)):
            if _is_one(d):
                continue
            if _is_one(out[i]) or _same(out[i], d):
                out[i] = d
            else:
                raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast at axis {i} ({out[i]} vs {d})")
    return tuple(out)


def _is_one(size: Any) -> bool:
    return not is_dim(size) and int(size) == 1


def _same(a: Any, b: Any) -> bool:
    """Whether two sizes are equal for every value of the symbolic dimensions (decided, or refused)."""
    if not (is_dim(a) or is_dim(b)):
        return int(a) == int(b)
    difference = a - b
    if not is_dim(difference):
        return int(difference) == 0
    return not _decide(lambda: difference >= 1 or difference <= -1, f"{a} == {b}")


def _decide(question: Callable[[], bool], what: str) -> bool:
    try:
        return bool(question())
    except Exception as e:  # jax's InconclusiveDimensionOperation is not exported
        raise ValueError(
            f"{what} depends on the value of a symbolic dimension; onnx2jax does not guess it "
            "(export with that dimension fixed, or with constraints that decide it)"
        ) from e


def _compare(op: Callable[[Any, Any], bool], name: str) -> Callable[[Any, Any], bool]:
    def compare(a: Any, b: Any) -> bool:
        if name == "==":
            return _same(a, b)
        return _decide(lambda: op(a, b), f"{a} {name} {b}")

    return compare


def _max(a: Any, b: Any) -> Any:
    return jax.core.max_dim(a, b) if is_dim(a) or is_dim(b) else max(a, b)


def _min(a: Any, b: Any) -> Any:
    return jax.core.min_dim(a, b) if is_dim(a) or is_dim(b) else min(a, b)


def _div(a: Any, b: Any) -> Any:
    # ONNX's integer Div truncates; a DimExpr's // floors: equal for the sizes of non-negative dims.
    if not is_dim(b) and int(b) < 0:
        return -(a // -b)
    return a // b


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "Add": operator.add,
    "Sub": operator.sub,
    "Mul": operator.mul,
    "Div": _div,
    "Mod": operator.mod,
    "Max": _max,
    "Min": _min,
    "Equal": _compare(operator.eq, "=="),
    "Less": _compare(operator.lt, "<"),
    "LessOrEqual": _compare(operator.le, "<="),
    "Greater": _compare(operator.gt, ">"),
    "GreaterOrEqual": _compare(operator.ge, ">="),
}
FOLDED = frozenset(_BINARY) | {"Neg", "Cast", "Where"}
"""Ops :func:`fold` computes on symbolic shape values (where it can; else their implementation runs)."""
_COMPARISONS = frozenset({"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"})

STRUCTURAL = frozenset({
    "Shape", "Size", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice", "Reshape", "Expand",
    "Identity", "Flatten", "Transpose", "Split", "Tile", "GatherElements",
})
"""Ops whose numpy implementation only moves elements: they run on object arrays as on int64 ones."""


def fold(op_type: str, inputs: Sequence[Any], attrs: Mapping[str, Any]) -> np.ndarray | None:
    """Arithmetic, comparisons and integer Casts of symbolic shape values, with numpy on the objects.

    Returns None for anything else: the graph runner then runs the op's
    implementation (numpy for :data:`STRUCTURAL` ops, jax otherwise).

    Raises:
      ValueError: a comparison, Max or Min whose answer depends on a symbolic dimension's value.
    """
    if op_type in _BINARY and len(inputs) >= 2 and not (set(attrs) - {"consumed_inputs"}):
        fn = np.frompyfunc(_BINARY[op_type], 2, 1)
        result = inputs[0]
        for other in inputs[1:]:
            result = fn(_objects(result), _objects(other))
        if op_type in _COMPARISONS:
            return np.asarray(result, dtype=bool)
        return value(result, np.asarray(inputs[0]).dtype)
    if op_type == "Neg":
        return value(-_objects(inputs[0]), np.asarray(inputs[0]).dtype)
    if op_type == "Cast":
        target = np.dtype(_onnx_dtype(attrs["to"]))
        return value(_objects(inputs[0]), target) if target.kind in "iu" and target.itemsize >= 4 else None
    if op_type == "Where":
        condition, x, y = inputs
        if is_symbolic(condition) or np.asarray(condition).dtype != np.bool_:
            return None
        return value(np.where(condition, _objects(x), _objects(y)), np.asarray(x).dtype)
    return None


def _objects(array: Any) -> np.ndarray:
    """An int or object array as an object array of Python ints and ``DimExpr``s (numpy ints do not mix)."""
    array = np.asarray(array)
    out = np.empty(array.shape, dtype=object)
    out[...] = array if array.dtype == object else array.astype(object)
    return out


def _onnx_dtype(to: int) -> Any:
    import onnx.helper

    return onnx.helper.tensor_dtype_to_np_dtype(int(to))


__all__ = ["FOLDED", "STRUCTURAL", "as_jax", "as_jax_inputs", "broadcast_shapes", "dims", "fold", "has_dims", "is_dim",
           "is_symbolic", "named_shape", "value"]
