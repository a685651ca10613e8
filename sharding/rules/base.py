"""What every rule shares: the `Rule` base, the node context, and the words of messages.

A rule declares the op types it covers and has one method,
``propagate(ctx, in_specs) -> (out_specs, diagnostics)``; `NodeContext` gives it the
node's attributes, shapes and constants and collects its diagnostics. The engines
that build output specs are `sharding.rules.contract` and `sharding.rules.regroup`,
on the spec views of `sharding.rules.views`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from sharding import codes
from sharding.diagnostics import Diagnostic, Severity
from sharding.spec import ShardingSpec
from sharding.text import format_spec


Dim = int | str | None
Shape = tuple[Dim, ...]
Label = Hashable
Specs = list[ShardingSpec | None]
Result = tuple[Specs, list[Diagnostic]]


def text(spec: ShardingSpec | None) -> str:
    """A spec in the text notation, or ``"unknown"``."""
    return "unknown" if spec is None else format_spec(spec)


def devs(devices: Sequence[int] | frozenset[int]) -> str:
    """``{0,1}``-style text for a device set."""
    return "{" + ",".join(map(str, sorted(devices))) + "}"


@dataclass
class NodeContext:
    """What a rule may know about its node.

    Attributes:
        node: The node.
        in_shapes: Per input position, the shape (dims are ints, symbols or
            None), or None when unknown or the input is empty.
        out_shapes: Per output position, likewise.
        constants: Values of the inputs that are initializers or Constant
            outputs, by tensor name.
        opset: The model's default-domain opset.
        diagnostics: Where `diag` collects the rule's findings.
    """

    node: onnx.NodeProto
    in_shapes: tuple[Shape | None, ...]
    out_shapes: tuple[Shape | None, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    opset: int = 21
    diagnostics: list[Diagnostic] = field(default_factory=list)
    _attrs: dict[str, Any] | None = None

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def attrs(self) -> dict[str, Any]:
        """The node's attributes as Python values (graphs and tensors left as protos)."""
        if self._attrs is None:
            self._attrs = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}
        return self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def input_name(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def constant(self, index: int) -> np.ndarray | None:
        """The value of input ``index`` when it is a constant, else None."""
        name = self.input_name(index)
        return self.constants.get(name) if name else None

    def int_list(self, attr: str, index: int) -> list[int] | None:
        """An int list given as attribute ``attr`` (older opsets) or as constant input ``index``."""
        if attr in self.attrs:
            value = self.attrs[attr]
            return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        value = self.constant(index)
        return None if value is None else [int(v) for v in np.asarray(value).ravel()]

    def rank(self, index: int) -> int | None:
        shape = self.in_shapes[index] if index < len(self.in_shapes) else None
        return None if shape is None else len(shape)

    def out_rank(self, index: int) -> int | None:
        shape = self.out_shapes[index] if index < len(self.out_shapes) else None
        return None if shape is None else len(shape)

    def diag(
        self,
        code: str,
        message: str,
        hint: str | None = None,
        *,
        severity: Severity = "error",
        tensor: str | None = None,
        axis: int | None = None,
        given: str | None = None,
        expected: str | None = None,
    ) -> None:
        """Records a diagnostic about this node."""
        extra = {}
        if given is not None or expected is not None:
            extra = {"given": given, "expected": expected}
        self.diagnostics.append(
            Diagnostic(
                code=code,
                severity=severity,
                node=self.node.name,
                op_type=self.node.op_type,
                tensor=tensor,
                axis=axis,
                message=message,
                hint=hint,
                **extra,
            )
        )

    def unknown_rank(self, index: int = 0) -> None:
        """A warning that the rank of input ``index`` is unknown where a rule needs it."""
        name = self.input_name(index)
        self.unknown(f"the rank of {name!r} is unknown", tensor=name)

    def data_rank(self) -> int | None:
        """The rank of input 0, else of output 0 (ops that keep their rank); when neither is
        known, says so (`unknown_rank`) and returns None."""
        rank = self.rank(0) if self.rank(0) is not None else self.out_rank(0)
        if rank is None:
            self.unknown_rank(0)
        return rank

    def unknown(self, what: str, tensor: str | None = None) -> None:
        """A warning that a rule lacks a shape or constant it needs."""
        self.diag(
            codes.SHAPE_UNKNOWN,
            f"cannot infer the output sharding: {what}",
            "give concrete input shapes (input_shapes= or --input-shape) or make the value "
            "a constant",
            severity="warning",
            tensor=tensor,
        )


class Rule:
    """Base of all rules: subclasses set ``ops`` and implement `outputs`."""

    ops: frozenset[str] = frozenset()

    def propagate(
        self, ctx: NodeContext, in_specs: Sequence[ShardingSpec | None]
    ) -> tuple[list[ShardingSpec | None], list[Diagnostic]]:
        """Output specs of the node and the problems found (see the module docstring)."""
        outs = list(self.outputs(ctx, list(in_specs)))
        outs += [None] * (len(ctx.node.output) - len(outs))
        outs = [None if not name else spec for name, spec in zip(ctx.node.output, outs, strict=False)]
        return outs, list(ctx.diagnostics)

    def outputs(
        self, ctx: NodeContext, in_specs: list[ShardingSpec | None]
    ) -> list[ShardingSpec | None]:  # pragma: no cover - abstract
        raise NotImplementedError
