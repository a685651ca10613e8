"""The names of a compiled model's placements: which node input or output (`SpecKey`), how it is laid out
(`TensorPlacement`), and the HLO scope of a node (`node_scope`).

Their own module so that the hooks that read them (`onnx2jax.runtime.constraints`, `stacks`,
`partial_sums`) and the planning and reporting modules import them without an import circle.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from jax.sharding import NamedSharding

from sharding.mesh.layout import expand_shape


class SpecKey(NamedTuple):
    """One node input or output that carries a spec."""

    node: str
    kind: str  # "in" or "out"
    position: int
    tensor: str

    def __str__(self) -> str:
        return f"node {self.node!r} {self.kind}put {self.position} ({self.tensor!r})"


@dataclasses.dataclass(frozen=True)
class TensorPlacement:
    """How one tensor is laid out on the mesh.

    ``fused`` lists the fused axes and their sub-axis sizes: the sharding
    applies to the tensor reshaped to its sub-axes.
    """

    sharding: NamedSharding
    fused: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def expand(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The unfused shape of a tensor of ONNX ``shape``."""
        return expand_shape(shape, self.fused)


def node_scope(name: str) -> str:
    """The named scope of an ONNX node in HLO metadata: its name, with ``/`` (a scope separator) escaped."""
    return "onnx:" + name.replace("/", "|")
