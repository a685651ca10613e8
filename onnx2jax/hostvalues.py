"""Values a jitted program computes in part and the host finishes: strings and maps.

XLA has neither strings nor maps, yet classical-ML models return both: a
classifier's label is one of its string class names, and ZipMap turns a
probability matrix into one ``{label: probability}`` dict per row. What
decides them at run time is numeric (the index of the winning class, the
probabilities), so the program computes that part and carries the rest as
static data:

* :class:`StringLabels` is ``table[index]``: the table is a tuple of strings
  fixed when the model is traced, the index a jax array.
* :class:`MapSequence` is ``[dict(zip(keys, row)) for row in values]``.

Both are jax pytrees (the array is the leaf, the table or keys the static
part), so ``jax.jit`` returns them from a compiled program. Calling a
:class:`~onnx2jax.translate.JaxModel` finishes them with :func:`to_host`
into what onnxruntime returns: a numpy object array of ``str``, and a list
of dicts of Python floats. ``model.fn`` returns them as they are.

Only graph outputs (and Identity) may carry them: an op that would compute on
such a value is refused by name, since its strings do not exist until the
program has run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class StringLabels:
    """A string tensor ``table[index]`` whose index is only known at run time.

    Attributes:
      table: the strings to choose from.
      index: int array (any shape) of positions in ``table``; the tensor's shape.
    """

    table: tuple[str, ...]
    index: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(np.shape(self.index))

    def describe(self) -> str:
        return f"a string tensor of shape {self.shape} chosen at run time from {len(self.table)} strings"

    def to_host(self) -> np.ndarray:
        """The strings, as a numpy object array of ``str``."""
        return np.array(self.table, dtype=object)[np.asarray(self.index)]

    def tree_flatten(self):
        return (self.index,), self.table

    @classmethod
    def tree_unflatten(cls, table, children):
        return cls(table, children[0])


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class MapSequence:
    """ONNX ``seq(map(K, float))``: one map per row of ``values``, keyed by ``keys``.

    Attributes:
      keys: the map keys (str, or int for int64 keys), one per column.
      values: float array [N, len(keys)].
    """

    keys: tuple
    values: Any

    def describe(self) -> str:
        return f"a sequence of {np.shape(self.values)[0]} maps with {len(self.keys)} keys"

    def to_host(self) -> list[dict]:
        """A list of dicts ``{key: float}``, one per row, as onnxruntime returns ZipMap's output."""
        rows = np.asarray(self.values).tolist()
        return [dict(zip(self.keys, row)) for row in rows]

    def tree_flatten(self):
        return (self.values,), self.keys

    @classmethod
    def tree_unflatten(cls, keys, children):
        return cls(keys, children[0])


HOST_VALUE_TYPES = (StringLabels, MapSequence)


def is_host_value(value: Any) -> bool:
    """Whether ``value`` is finished on the host (a :class:`StringLabels` or :class:`MapSequence`)."""
    return isinstance(value, HOST_VALUE_TYPES)


def to_host(value: Any) -> Any:
    """Finishes a host value (see the module docstring); anything else is returned unchanged."""
    if isinstance(value, list):
        return [to_host(v) for v in value]
    return value.to_host() if is_host_value(value) else value
