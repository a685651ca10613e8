"""The models `check` and `infer` accept: a ModelProto, a path, serialized bytes, or an onnx_ir.Model.

Like `onnx2jax.translate` and `onnx2jax.compile`, the checker takes a path
as readily as a proto. Annotations and shapes are all it reads, so a path's
external weights are left on disk. An ``onnx_ir.Model`` (onnx-ir reads and
writes these annotations too) is serialized to a proto; onnx_ir is imported
only when one is passed.
"""

from __future__ import annotations

import os
from typing import Any, Union

import onnx

ModelArg = Union[onnx.ModelProto, str, os.PathLike, bytes, Any]


def as_model_proto(model: ModelArg) -> onnx.ModelProto:
    """Returns ``model`` as a ModelProto (the same object when it is one).

    Raises:
        FileNotFoundError: a path that does not exist.
        TypeError: an object that is none of the accepted kinds.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model), load_external_data=False)
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir

        if isinstance(model, onnx_ir.Model):
            old = model.ir_version  # onnx_ir drops the annotations below IR version 11
            model.ir_version = max(old or 0, 11)
            try:
                return onnx_ir.to_proto(model)
            finally:
                model.ir_version = old
    raise TypeError(
        f"expected a ModelProto, a path, bytes or an onnx_ir.Model; got {type(model).__name__}"
    )
