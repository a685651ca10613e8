"""The short path of a repeated :class:`onnx2jax.runtime.spmd.Compiled` call.

A compiled model's first call with a given input signature binds and checks
the inputs, infers the shardings at their shapes, places them on the mesh and
traces the program under the model's mesh and, for 64-bit models, x64 mode.
Both contexts are part of ``jax.jit``'s cache key, so every later call would
have to enter them again before jit's C++ dispatch could find the executable.

Instead, the first call compiles the program ahead of time
(``jitted.lower(...).compile()``) and keeps it with what it decided, keyed by
:func:`onnx2jax.call_keys.call_key`: the inputs' types, shapes, dtypes and (for jax.Arrays)
shardings. A later call with the same key goes straight to the executable's
C++ dispatch, which places numpy inputs with the shardings the first call
chose; only 64-bit models still enter x64 mode (numpy int64 inputs would
otherwise be read as int32).

:class:`onnx2jax.translate.JaxModel` uses the same key: a signature its
input checks accepted once is bound without checking again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import jax

from onnx2jax.x64 import x64_scope


@dataclasses.dataclass(frozen=True)
class FastCall:
    """One input signature's executable and the arguments the full path gave it.

    Attributes:
      executable: the program compiled ahead of time for these inputs.
      stored: the placed parameters (the executable's first argument).
      names: the graph input each positional input binds to.
      moves: per input name, the sharding a jax.Array input was moved to by
        the full path (an array on other devices, or relabelled from Explicit
        to Auto axes); an input not listed goes as it is.
      x64: enter :func:`~onnx2jax.x64.x64_scope` for the call (a 64-bit model with x64 off).
    """

    executable: Any
    stored: tuple
    names: tuple[str, ...]
    moves: tuple[tuple[str, Any], ...]
    x64: bool

    def __call__(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple:
        values = dict(zip(self.names, inputs))
        if named:
            values.update(named)
        for name, sharding in self.moves:
            values[name] = jax.device_put(values[name], sharding)
        if self.x64:
            with x64_scope(True):
                return self.executable(self.stored, values)
        return self.executable(self.stored, values)


def moved_inputs(given: Mapping[str, Any], placed: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The jax.Array inputs the full path placed elsewhere than they were: (name, sharding) pairs."""
    moves = []
    for name, value in given.items():
        if isinstance(value, jax.Array) and placed[name] is not value:
            moves.append((name, placed[name].sharding))
    return tuple(moves)
