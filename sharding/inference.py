"""What sharding inference gives: every node's complete specs, every placed tensor's, and the problems found.

The values :func:`sharding.infer` (`sharding.stage_infer.infer`) returns (one model, or one pipeline
stage at a time merged by :mod:`sharding.stage_infer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sharding.diagnostics import Diagnostic
from sharding.shapes import Shape
from sharding.spec import ShardingSpec


@dataclass(frozen=True)
class NodeShardings:
    """Complete specs of one node after inference.

    Attributes:
        node: The node's name.
        op_type: Its op type.
        inputs: Per ``node.input`` position: the spec the node runs it with;
            None for an empty input name or when nothing is known.
        outputs: Per ``node.output`` position: written or inferred; None
            when no rule covers the op and none was written.
        given_inputs: Which input specs were written in the model.
        given_outputs: Which output specs were written in the model.
    """

    node: str
    op_type: str
    inputs: tuple[ShardingSpec | None, ...]
    outputs: tuple[ShardingSpec | None, ...]
    given_inputs: tuple[bool, ...]
    given_outputs: tuple[bool, ...]


@dataclass(frozen=True)
class Inference:
    """The result of `infer`.

    Attributes:
        configuration: The device configuration used, or None when the model
            has none.
        nodes: By node name (``"<op_type>#<index>"`` for unnamed nodes), in
            topological order.
        tensors: Each tensor's spec as its producer leaves it; model inputs
            and initializers as first consumed (an initializer's entry is
            informative only: each consumer takes its own written spec, or
            the initializer unsharded).
        diagnostics: Errors, warnings and notes (reshards, collectives).
        shapes: Tensor shapes known after shape inference (ints, symbols or
            None per axis).
    """

    configuration: str | None
    nodes: dict[str, NodeShardings]
    tensors: dict[str, ShardingSpec]
    diagnostics: tuple[Diagnostic, ...]
    shapes: Mapping[str, Shape] = field(default_factory=dict, repr=False, compare=False)

    def errors(self) -> list[Diagnostic]:
        """The diagnostics of severity ``error``."""
        return [d for d in self.diagnostics if d.severity == "error"]


__all__ = ["Inference", "NodeShardings"]
