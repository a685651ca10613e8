"""Writing a model whose weights stay where they are: a small .onnx beside its external data.

An annotated model differs from its source only in annotations, so
:func:`save_model` writes the graph alone and points its tensors at the
source's external data (locations rewritten relative to the output). Asked
for (``data_size``), it writes new external data instead: numbered files of at
most ``data_size`` bytes each (a tensor larger than that gets a file of its
own), each tensor at a 64-byte-aligned offset, copied from the source's
memory map in chunks, so that no path holds the model's weights in memory and
no protobuf passes 2 GB.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.external_data_helper as edh
import onnx.numpy_helper

from onnx2jax.errors import ModelLoadError
from onnx2jax.loading import drop_pages

PROTOBUF_LIMIT = 2**31 - 1
"""Bytes: protobuf cannot serialize a message larger than this."""

INLINE_LIMIT = 1024
"""Bytes: with ``data_size``, tensors larger than this move to the external data files (onnx's default)."""

_ALIGN = 64
_CHUNK = 64 << 20


def save_model(
    proto: onnx.ModelProto, output: str | os.PathLike, source_dir: str | None, *, data_size: int | None = None
) -> list[str]:
    """Writes ``proto`` to ``output``; its weights stay in ``source_dir``'s files or go to new ones.

    ``proto`` is edited in place (its external data locations). Tensors that
    are inline stay inline, unless ``data_size`` is given.

    Args:
      proto: the model, external data not loaded (``onnx2jax.loading.open_model``).
      output: the .onnx to write.
      source_dir: where ``proto``'s external data lives (None: it has none).
      data_size: write new external data, in files of at most this many bytes.

    Returns:
      The files written (the model first).

    Raises:
      ModelLoadError: the source data would be outside the output's directory
        (write the output there, or pass ``data_size``); the model would be a
        protobuf over 2 GB (pass ``data_size``).
    """
    output = os.fspath(output)
    out_dir = os.path.dirname(os.path.abspath(output))
    written = [output]
    if data_size is None:
        _point_at_source(proto, source_dir, out_dir)
    else:
        if data_size < 1:
            raise ValueError(f"data_size must be >= 1 byte, got {data_size}")
        written += _write_external(proto, output, source_dir, data_size)
    size = proto.ByteSize()
    if size > PROTOBUF_LIMIT:
        raise ModelLoadError(
            f"the model holds {size / 2**30:.2f} GiB inline, more than a protobuf can hold (2 GiB); "
            "write its weights as external data (annotate --external-data-size SIZE)"
        )
    with open(output, "wb") as f:
        f.write(proto.SerializeToString())
    return written


def _external(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [t for t in edh._get_all_tensors(proto) if edh.uses_external_data(t)]


def _set_location(tensor: onnx.TensorProto, location: str, offset: int | None, length: int | None) -> None:
    fields = {"location": location}
    if offset is not None:
        fields["offset"] = str(offset)
    if length is not None:
        fields["length"] = str(length)
    kept = [(e.key, e.value) for e in tensor.external_data if e.key not in ("location", "offset", "length")]
    del tensor.external_data[:]
    for key, value in [*fields.items(), *kept]:
        tensor.external_data.add(key=key, value=value)
    tensor.data_location = onnx.TensorProto.EXTERNAL


def _point_at_source(proto: onnx.ModelProto, source_dir: str | None, out_dir: str) -> None:
    """Rewrites each external location relative to ``out_dir``; refuses one outside it."""
    external = _external(proto)
    if external and source_dir is None:
        raise ModelLoadError("the model refers to external data but its directory is unknown; pass its path")
    real_out = os.path.realpath(out_dir)
    for tensor in external:
        info = edh.ExternalDataInfo(tensor)
        target = os.path.realpath(os.path.join(source_dir, info.location))
        relative = os.path.relpath(target, real_out)
        if os.path.isabs(relative) or relative.split(os.sep)[0] == os.pardir:
            raise ModelLoadError(
                f"tensor {tensor.name!r}: its data {target!r} is outside the output's directory {real_out!r}, "
                "and models read external data from their own directory only; write the output next to the "
                "source model, or copy the weights (annotate --external-data-size SIZE)"
            )
        _set_location(tensor, relative.replace(os.sep, "/"), info.offset, info.length)


def _source_bytes(tensor: onnx.TensorProto, source_dir: str | None) -> np.ndarray:
    """The tensor's stored bytes as a uint8 array: a memory map for external data."""
    if edh.uses_external_data(tensor):
        info = edh.ExternalDataInfo(tensor)
        path = os.path.join(source_dir or "", info.location)
        length = info.length if info.length else os.path.getsize(path) - (info.offset or 0)
        if not length:
            return np.zeros(0, np.uint8)
        return np.memmap(path, dtype=np.uint8, mode="r", offset=info.offset or 0, shape=(length,))
    if tensor.HasField("raw_data"):
        return np.frombuffer(tensor.raw_data, np.uint8)
    return np.frombuffer(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(tensor)).raw_data, np.uint8)


def _write_external(proto: onnx.ModelProto, output: str, source_dir: str | None, data_size: int) -> list[str]:
    """Copies every large tensor into numbered files ``<output stem>.<k>.data`` beside ``output``."""
    out_dir = os.path.dirname(os.path.abspath(output))
    stem = os.path.splitext(os.path.basename(output))[0]
    sources = set()
    if source_dir is not None:
        sources = {os.path.realpath(os.path.join(source_dir, edh.ExternalDataInfo(t).location)) for t in _external(proto)}
    files: list[str] = []
    handle = None
    used = 0
    try:
        for tensor in edh._get_all_tensors(proto):
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            external = edh.uses_external_data(tensor)
            if not external and len(tensor.raw_data) <= INLINE_LIMIT and (
                tensor.HasField("raw_data") or tensor.ByteSize() <= INLINE_LIMIT
            ):
                continue
            data = _source_bytes(tensor, source_dir)
            start = -used % _ALIGN + used
            if handle is None or (used and start + data.size > data_size):
                if handle is not None:
                    handle.close()
                name = f"{stem}.{len(files)}.data"
                path = os.path.join(out_dir, name)
                if os.path.realpath(path) in sources:
                    raise ModelLoadError(f"{path!r} is the source's own data file; choose another output name")
                handle = open(path, "wb")
                files.append(path)
                used = start = 0
            handle.write(b"\0" * (start - used))
            for begin in range(0, data.size, _CHUNK):
                handle.write(data[begin : begin + _CHUNK].tobytes())
            drop_pages(data)
            used = start + data.size
            if not external:
                tensor.ClearField("raw_data")
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                    tensor.ClearField(field)
            _set_location(tensor, os.path.basename(files[-1]), start, int(data.size))
    finally:
        if handle is not None:
            handle.close()
    return files


__all__ = ["INLINE_LIMIT", "PROTOBUF_LIMIT", "save_model"]
