"""Reading a ModelProto from a path, bytes or a proto, with its external data.

External data is read from the model's own directory only: a location that
escapes it (``../x``, an absolute path, a symlink out) is refused, and so is
data that is missing or shorter than the tensor it claims to hold.
"""

from __future__ import annotations

import os
from typing import Union

import onnx
import onnx.external_data_helper
import onnx.inliner
from google.protobuf.message import DecodeError

from onnx2jax.errors import ModelLoadError

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]


def load_model(model: ModelLike, *, inline: bool = True) -> onnx.ModelProto:
    """Returns a self-contained ModelProto: external data loaded, local functions inlined.

    Args:
      model: a path to a .onnx file, its serialized bytes, or a ModelProto.
        A ModelProto whose tensors still point at external data is resolved
        against the current directory only if it carries no such references.
      inline: inline the model-local FunctionProtos (``onnx.inliner``).

    Raises:
      ModelLoadError: unreadable or truncated file, or external data that is
        missing, truncated, or outside the model's directory.
    """
    if isinstance(model, onnx.ModelProto):
        proto = model
        if _external_tensors(proto):
            raise ModelLoadError(
                "the ModelProto refers to external data; pass the model's path "
                "so that the data can be found next to it"
            )
    elif isinstance(model, bytes):
        proto = _parse(model, "<bytes>")
        if _external_tensors(proto):
            raise ModelLoadError("model bytes refer to external data; pass the model's path")
    else:
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ModelLoadError(f"cannot read model {path!r}: {e}") from e
        proto = _parse(data, path)
        if _external_tensors(proto):
            _load_external(proto, os.path.dirname(os.path.abspath(path)))
    if inline and len(proto.functions):
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as e:
        raise ModelLoadError(
            f"{where} is not a valid ONNX model (truncated or corrupt file): {e}"
        ) from e
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{where} holds no graph: not an ONNX model, or an empty file")
    return proto


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in onnx.external_data_helper._get_all_tensors(proto)
        if onnx.external_data_helper.uses_external_data(t)
    ]


def _load_external(proto: onnx.ModelProto, base_dir: str) -> None:
    """Checks every external reference against ``base_dir`` and reads it in."""
    base = os.path.realpath(base_dir)
    for tensor in _external_tensors(proto):
        info = onnx.external_data_helper.ExternalDataInfo(tensor)
        location = info.location
        if os.path.isabs(location):
            raise ModelLoadError(
                f"tensor {tensor.name!r}: external data location {location!r} is "
                "absolute; only paths inside the model's directory are allowed"
            )
        target = os.path.realpath(os.path.join(base, location))
        if os.path.commonpath([base, target]) != base:
            raise ModelLoadError(
                f"tensor {tensor.name!r}: external data location {location!r} "
                f"escapes the model's directory {base!r}"
            )
        if not os.path.isfile(target):
            raise ModelLoadError(
                f"tensor {tensor.name!r}: external data file {location!r} not found in {base!r}"
            )
        size = os.path.getsize(target)
        offset = info.offset or 0
        expected = _byte_size(tensor)
        length = info.length if info.length else (expected if expected is not None else size - offset)
        if offset + length > size or (expected is not None and length < expected):
            raise ModelLoadError(
                f"tensor {tensor.name!r}: external data {location!r} is truncated "
                f"(needs bytes [{offset}, {offset + max(length, expected or 0)}), file has {size})"
            )
    onnx.external_data_helper.load_external_data_for_model(proto, base)


def _byte_size(tensor: onnx.TensorProto) -> int | None:
    """The raw byte size a tensor of this dtype and shape needs, when fixed."""
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    if tensor.data_type in (onnx.TensorProto.STRING,):
        return None
    count = 1
    for d in tensor.dims:
        count *= d
    bits = {onnx.TensorProto.INT4: 4, onnx.TensorProto.UINT4: 4}.get(tensor.data_type)
    if bits:
        return (count * bits + 7) // 8
    return count * itemsize
