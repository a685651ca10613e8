"""Exceptions raised while loading, translating and running ONNX models."""

from __future__ import annotations


class ModelLoadError(ValueError):
    """The model file, or its external data, cannot be read safely."""


class UnsupportedOpError(NotImplementedError):
    """The model uses ops that onnx2jax does not implement.

    Attributes:
      missing: every unsupported ``(domain, op_type, opset)`` of the model,
        sorted, each once.
    """

    def __init__(self, missing: list[tuple[str, str, int]]):
        self.missing = sorted(set(missing))
        listed = ", ".join(
            f"{d or 'ai.onnx'}::{op}@{v}" for d, op, v in self.missing
        )
        super().__init__(f"{len(self.missing)} unsupported op(s): {listed}")


class NodeError(RuntimeError):
    """An op failed while tracing; names the node, its op_type and opset."""


class PrecisionError(RuntimeError):
    """A model with 64-bit tensors is traced while JAX's x64 mode is off."""
