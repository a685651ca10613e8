"""What an automatic plan refuses, each a ``ValueError`` naming what is wrong and what would work.

Re-exported, with the runtime's errors, by `onnx2jax.errors`.
"""

from __future__ import annotations


class AutoPlanError(ValueError):
    """An automatic plan cannot be made for this request (the subclasses say why)."""


class MemoryLimitError(AutoPlanError):
    """No layout fits the memory limit per device; the message names the smallest that does and its layout."""


class DeviceSplitError(AutoPlanError):
    """The device count cannot split the model: no layout uses more than one device's worth of it."""


class MeshShapeError(AutoPlanError):
    """A mesh shape that does not exist: its product is not the device count, or an axis is unknown or < 1."""


__all__ = ["AutoPlanError", "DeviceSplitError", "MemoryLimitError", "MeshShapeError"]
