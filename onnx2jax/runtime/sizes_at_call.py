"""Sizes written on symbolic axes, checked against each call's shapes.

A ``dim_value`` (or fused sub-axis sizes) written on an axis whose size the
model leaves symbolic cannot be checked when the model is compiled:
``sharding.validate`` notes it (``size-unresolved``) and the check waits for a
call. `SizesAtCall` runs that check once per input shape signature, for the
single-program `onnx2jax.runtime.spmd.Compiled` and for the stages of
`onnx2jax.runtime.pipeline.PipelineCompiled` alike.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic
from sharding.validate import require_valid


class SizesAtCall:
    """The per-call check of sizes written on symbolic axes (a no-op when there are none)."""

    def __init__(self, proto: onnx.ModelProto, structural: Sequence[Diagnostic]):
        """``structural``: what ``sharding.validate`` found at compile time (its ``size-unresolved`` notes)."""
        self._proto = proto if any(d.code == codes.SIZE_UNRESOLVED for d in structural) else None
        self._checked: set[tuple] = set()

    def check(self, input_shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Refuses shapes that contradict a written size.

        Raises:
          sharding.ShardingError: ``dim-value-mismatch`` naming the node, tensor and axis.
        """
        if self._proto is None:
            return
        key = tuple(sorted((name, tuple(shape)) for name, shape in input_shapes.items()))
        if key not in self._checked:
            require_valid(self._proto, input_shapes=dict(key))
            self._checked.add(key)
