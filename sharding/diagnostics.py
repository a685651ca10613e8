"""Diagnostics: one problem found in a model's multi-device annotations.

A `Diagnostic` names where the problem is (node, op type, tensor, axis), what
was found against what was expected (`message`) and what would make it valid
(`hint`). Checkers return lists of them so that a user sees every problem in
one pass; `ShardingError` carries such a list when a caller must stop. Its
code must be one that `sharding.codes` registers.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sharding.codes import CODES, Severity

_SEVERITIES = ("error", "warning", "note")


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    """One problem, located as precisely as the checker knows.

    Attributes:
        code: Stable kebab-case identifier registered in `sharding.codes`, e.g. ``codes.AXIS_REPEATED``.
        severity: ``"error"``, ``"warning"`` or ``"note"``.
        node: Name of the node, or None for model-level problems.
        op_type: The node's op type, when a node is named.
        tensor: The tensor the problem is about, if any.
        axis: The axis as written in the annotation, if any.
        message: What was found, against what was expected, quoting values.
        hint: What would make the annotation valid, if known.
        given: What the model has there, e.g. a spec in the text notation.
        expected: What the op needs there, or the collective a reshard costs.
    """

    code: str
    severity: Severity
    node: str | None = None
    op_type: str | None = None
    tensor: str | None = None
    axis: int | None = None
    message: str
    hint: str | None = None
    given: str | None = None
    expected: str | None = None

    def __post_init__(self) -> None:
        if self.code not in CODES:
            raise ValueError(f"Diagnostic.code must be a kebab-case code registered in sharding.codes, got {self.code!r}")
        if self.severity not in _SEVERITIES:
            raise ValueError(
                f"Diagnostic.severity must be one of {_SEVERITIES}, got {self.severity!r}"
            )

    @property
    def location(self) -> str:
        """Where the problem is, e.g. ``"node 'mm0' (MatMul), tensor 'X', axis 1"``."""
        parts = []
        if self.node is not None:
            parts.append(f"node {self.node!r}" + (f" ({self.op_type})" if self.op_type else ""))
        if self.tensor is not None:
            parts.append(f"tensor {self.tensor!r}")
        if self.axis is not None:
            parts.append(f"axis {self.axis}")
        return ", ".join(parts)

    def __str__(self) -> str:
        head = f"{self.severity}[{self.code}]"
        if self.location:
            head += " " + self.location
        text = f"{head}: {self.message}"
        if self.hint:
            text += f"; hint: {self.hint}"
        return text


class ShardingError(ValueError):
    """Raised when annotations are invalid; holds every diagnostic found.

    Attributes:
        diagnostics: The diagnostics, in the order they were found.
    """

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        errors = sum(d.severity == "error" for d in self.diagnostics)
        lines = [f"{errors} sharding error(s):"]
        lines += [str(d) for d in self.diagnostics]
        super().__init__("\n".join(lines))
