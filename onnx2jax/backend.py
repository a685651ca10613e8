"""onnx2jax as an ``onnx.backend.base.Backend``, for ONNX's backend test runner.

Example:
  >>> import onnx2jax.backend as backend
  >>> rep = backend.prepare(model)                  # doctest: +SKIP
  >>> outputs = rep.run([x])                        # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from onnx2jax.translate import JaxModel, translate


class JaxBackendRep(BackendRep):
    """A prepared model: a translated, lazily jitted :class:`JaxModel`."""

    def __init__(self, model: JaxModel):
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple:
        """Runs on a sequence of inputs (in graph-input order) or a dict name -> array."""
        if isinstance(inputs, dict):
            outputs = self.model(**inputs)
        elif isinstance(inputs, (list, tuple)):
            outputs = self.model(*inputs)
        else:
            outputs = self.model(inputs)
        return tuple(_to_numpy(o) for o in outputs)


def _to_numpy(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_to_numpy(v) for v in value]
    return None if value is None else np.asarray(value)


class JaxBackend(Backend):
    """Runs ONNX models with onnx2jax on the default JAX device."""

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> JaxBackendRep:
        return JaxBackendRep(translate(model))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def run_node(
        cls, node: onnx.NodeProto, inputs: Sequence[Any], device: str = "CPU", outputs_info: Any = None, **kwargs: Any
    ) -> tuple:
        raise NotImplementedError("onnx2jax runs whole models; wrap the node in a model")

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() in ("CPU", "CUDA", "GPU", "TPU")


prepare = JaxBackend.prepare
run_model = JaxBackend.run_model
supports_device = JaxBackend.supports_device
