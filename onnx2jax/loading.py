"""Reading a ModelProto from a path, bytes or a proto, with its external data.

External data is read from the model's own directory only: a location that
escapes it (``../x``, an absolute path, a symlink out) is refused, and so is
data that is missing or shorter than the tensor it claims to hold, or an
offset or length that is not a byte count. Every model is also checked by
:func:`onnx2jax.integrity.check_model` (known ir_version and opsets, embedded
tensors that hold what their dims say, one producer per tensor) before any
tensor is read.
"""

from __future__ import annotations

import copy
import mmap
import os
import weakref
from typing import Any, NamedTuple, Union

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.inliner
import onnx.numpy_helper
from google.protobuf.message import DecodeError

from onnx2jax.errors import ModelLoadError
from onnx2jax.integrity import check_model



class Opened(NamedTuple):
    """A model :func:`open_model` already opened: its proto (external weights still on disk) and their folder.

    Passed where a model is taken, it is used as it is (nothing read again): a caller that must look at or
    annotate the model before planning it (a generation handle writes its Megatron plan in place) opens it once.
    """

    proto: onnx.ModelProto
    external_dir: str | None


ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto, Opened, "onnx_ir.Model"]  # noqa: F821 - imported lazily


def _from_ir(model: object) -> object:
    """An ``onnx_ir.Model`` as a ModelProto (onnx_ir imported only when one is passed); anything else as is."""
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir

        if isinstance(model, onnx_ir.Model):
            return ir_to_proto(model)
    return model


def ir_to_proto(model: "onnx_ir.Model") -> onnx.ModelProto:  # noqa: F821
    """onnx_ir.to_proto, keeping the multi-device annotations of a model that says IR version < 11.

    onnx_ir drops them for such a model (the fields exist from IR version 11);
    the model's version is raised for the conversion only.
    """
    import onnx_ir

    old = model.ir_version
    if old is not None and old < 11:
        model.ir_version = 11
    try:
        return onnx_ir.to_proto(model)
    finally:
        model.ir_version = old


def load_model(model: ModelLike, *, inline: bool = True) -> onnx.ModelProto:
    """Returns a self-contained ModelProto: external data loaded, local functions inlined.

    For large models prefer :func:`open_model`, which leaves the weights on disk.

    Args:
      model: a path to a .onnx file, its serialized bytes, a ModelProto, or an
        ``onnx_ir.Model`` (converted with ``onnx_ir.to_proto``).
        A ModelProto whose tensors still point at external data is resolved
        against the current directory only if it carries no such references.
      inline: inline the model-local FunctionProtos (``onnx.inliner``).

    Raises:
      ModelLoadError: unreadable or truncated file, external data that is
        missing, truncated, or outside the model's directory, or a model that
        fails :func:`onnx2jax.integrity.check_model`.
    """
    model = _from_ir(model)
    if isinstance(model, onnx.ModelProto):
        proto = model
        check_model(proto, "<ModelProto>")
        if _external_tensors(proto):
            raise ModelLoadError(
                "the ModelProto refers to external data; pass the model's path "
                "so that the data can be found next to it"
            )
    elif isinstance(model, bytes):
        proto = _parse(model, "<bytes>")
        if _external_tensors(proto):
            raise ModelLoadError("model bytes refer to external data; pass the model's path")
    elif isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as e:
            raise ModelLoadError(f"cannot read model {path!r}: {e}") from e
        proto = _parse(data, path)
        if _external_tensors(proto):
            base = os.path.dirname(os.path.abspath(path))
            _check_external(proto, base)
            onnx.external_data_helper.load_external_data_for_model(proto, base)
    else:
        raise TypeError(
            f"expected a path, bytes, an onnx.ModelProto or an onnx_ir.Model; got {type(model).__name__}"
        )
    if inline and len(proto.functions):
        proto = onnx.inliner.inline_local_functions(proto)
    return proto


def open_model(model: ModelLike, *, inline: bool = True, weights: bool = True) -> tuple[onnx.ModelProto, str | None]:
    """Like :func:`load_model`, but the main graph's external initializers stay on disk.

    Their references are checked (inside the model's directory, present, long
    enough) and :func:`initializer_array` maps them read-only, so a model over
    2 GB never becomes one protobuf, and placing a sharded weight reads only
    each device's slice of the file.

    ``weights=False`` (an ahead-of-time compile for a target, which needs only shapes): the external
    weights' files are not opened, only their locations checked (inside the model's directory); a
    missing or truncated file is not an error here. Small non-float constants (shape vectors) are
    still read: shape inference needs their values.

    Returns:
      The ModelProto and the directory its external data is read from (None
      when it has none); an :class:`Opened` is returned as it is.
    """
    if isinstance(model, Opened):
        return model
    if not isinstance(model, (str, os.PathLike)):
        return load_model(model, inline=inline), None  # handles onnx_ir.Model too
    path = os.fspath(model)
    try:
        with open(path, "rb") as f:
            proto = _parse(f.read(), path)
    except OSError as e:
        raise ModelLoadError(f"cannot read model {path!r}: {e}") from e
    external = _external_tensors(proto)
    if not external:
        return load_model(proto, inline=inline), None
    base = os.path.dirname(os.path.abspath(path))
    in_main_graph = {id(t) for t in proto.graph.initializer}
    read = [t for t in external if id(t) not in in_main_graph or _is_small_constant(t)]
    _check_external(proto, base, None if weights else read)
    for tensor in external:  # subgraph constants and shape-sized tensors are small: read them in
        if id(tensor) not in in_main_graph or _is_small_constant(tensor):
            onnx.external_data_helper.load_external_data_for_tensor(tensor, base)
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]
    if inline and len(proto.functions):
        proto = onnx.inliner.inline_local_functions(proto)
    return proto, base


SMALL_TENSOR_LIMIT = 4096
"""Non-float external tensors up to this many elements are read into the proto by :func:`open_model`
(shape vectors, axes: ONNX shape inference needs their values; the weights stay on disk)."""

_FLOATS = {
    onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE,
}


def _is_small_constant(tensor: onnx.TensorProto) -> bool:
    count = 1
    for d in tensor.dims:
        count *= d
    return tensor.data_type not in _FLOATS and count <= SMALL_TENSOR_LIMIT


def drop_pages(array: np.ndarray) -> None:
    """Lets the kernel drop the resident pages of the file mapping behind ``array`` (a no-op for others).

    A memory-mapped weight's pages count in the process's memory once read.
    After its slices are on the devices they are not needed: the mapping is
    read-only and private, so dropping them is safe, and a later read (an
    array that aliases the mapping on CPU) faults them back in from the file.
    """
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
    while isinstance(base, np.memmap) and getattr(base, "_mmap", None) is None:
        base = base.base
    raw = getattr(base, "_mmap", None)
    if raw is not None and hasattr(raw, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            raw.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # a closed map, or a kernel without madvise: nothing to drop
            pass


def read_only_buffer(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An empty writable array at a 64-byte-aligned address (call :func:`freeze` once filled).

    On CPU, jax places an aligned read-only numpy array without copying it,
    so a buffer built on the host once (a stacked layer weight, a padded
    shard) is the device's copy, not a second one.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return aligned_view(np.empty(nbytes + 64, np.uint8), shape, dtype)


def aligned_view(raw: np.ndarray, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The array of ``shape`` at the first 64-byte-aligned address of the bytes ``raw``.

    jax on CPU keeps ``raw`` (the view's base) alive, not the view: this makes
    the view again from a buffer a device already holds.
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def freeze(array: np.ndarray) -> np.ndarray:
    """``array`` made read-only (so that jax on CPU may alias it instead of copying)."""
    array.flags.writeable = False
    return array


class ExternalTensor:
    """An external-data initializer known by its shape and dtype only: its file is not opened.

    What :class:`~onnx2jax.translate.JaxModel` holds for a weight when compiling ahead of time for a
    target (``defer_external``): planning, lowering and reports need shapes and dtypes, never values.
    :meth:`load` maps the data (:func:`initializer_array`), where something does need the values.
    """

    def __init__(self, tensor: onnx.TensorProto, base_dir: str | None):
        self.tensor, self.base_dir = tensor, base_dir
        self.name = tensor.name
        self.shape = tuple(int(d) for d in tensor.dims)
        self.dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        self.ndim = len(self.shape)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize

    def load(self) -> np.ndarray:
        """The values, memory-mapped read-only (the file is opened now); converted when held in another dtype."""
        array = initializer_array(self.tensor, self.base_dir)
        return array if array.dtype == self.dtype else array.astype(self.dtype)

    def astype(self, dtype: Any) -> "ExternalTensor":
        """The same tensor held as ``dtype`` (a compute dtype): still unread, converted when loaded."""
        held = copy.copy(self)
        held.dtype = np.dtype(dtype)
        held.nbytes = held.size * held.dtype.itemsize
        return held

    def __repr__(self) -> str:
        return f"ExternalTensor({self.name!r}, {list(self.shape)}, {self.dtype})"


def host_array(value: "np.ndarray | ExternalTensor") -> np.ndarray:
    """``value``'s values on the host: an :class:`ExternalTensor` is loaded, an array is itself."""
    return value.load() if isinstance(value, ExternalTensor) else value


def initializer_array(tensor: onnx.TensorProto, base_dir: str | None) -> np.ndarray:
    """An initializer as numpy: external data memory-mapped (read-only), the rest decoded."""
    if not onnx.external_data_helper.uses_external_data(tensor):
        return onnx.numpy_helper.to_array(tensor)
    if base_dir is None:
        raise ModelLoadError(f"tensor {tensor.name!r} refers to external data but no model directory is known")
    info = _external_info(tensor)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    packed = tensor.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.STRING)
    if packed or dtype.byteorder == ">":
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        onnx.external_data_helper.load_external_data_for_tensor(copy, base_dir)
        copy.data_location = onnx.TensorProto.DEFAULT
        del copy.external_data[:]
        return onnx.numpy_helper.to_array(copy)
    shape = tuple(tensor.dims)
    if not int(np.prod(shape)):
        return np.zeros(shape, dtype)
    return _mapped(os.path.join(base_dir, info.location), dtype, info.offset or 0, shape)


_MAPS: weakref.WeakValueDictionary[tuple, np.memmap] = weakref.WeakValueDictionary()


def _mapped(location: str, dtype: np.dtype, offset: int, shape: tuple[int, ...]) -> np.memmap:
    """One read-only map per tensor of a file and process, shared by every model read from it.

    A pipeline's stages each read their part of the model, and a tied
    embedding is in two of them (GPT-2's: the first stage's lookup, the
    last's head). Two maps of the same bytes count their pages twice in the
    process's memory (GPT-2's pipeline 2 x 4: 85 MB more); one map holds
    them once. Keyed by the file's identity (a file replaced or rewritten
    since is mapped anew), held only while something uses it.
    """
    stat = os.stat(location)
    key = (os.path.realpath(location), stat.st_dev, stat.st_ino, stat.st_mtime_ns, stat.st_size,
           np.dtype(dtype).str, offset, shape)
    found = _MAPS.get(key)
    if found is None:
        found = np.memmap(location, dtype=dtype, mode="r", offset=offset, shape=shape)
        found.file_identity = key
        _MAPS[key] = found
    return found


def file_identity(array: np.ndarray) -> tuple | None:
    """Which file bytes ``array`` views: its map's identity and the view's offset and layout (None: not a map)."""
    base = array
    while base is not None and getattr(base, "file_identity", None) is None:
        base = getattr(base, "base", None)
    if base is None:
        return None
    return (base.file_identity, array.ctypes.data - base.ctypes.data, array.shape, array.strides, array.dtype.str)


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
    check_model(proto, where)
    return proto


def _external_tensors(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [
        t
        for t in onnx.external_data_helper._get_all_tensors(proto)
        if onnx.external_data_helper.uses_external_data(t)
    ]


def _check_external(proto: onnx.ModelProto, base_dir: str, opened: list[onnx.TensorProto] | None = None) -> None:
    """Checks every external reference: inside ``base_dir``, present, and long enough.

    ``opened``: only these tensors' files are checked for presence and length (the others' are never
    opened: an ahead-of-time compile); every location is checked to be inside ``base_dir``.
    """
    base = os.path.realpath(base_dir)
    checked = None if opened is None else {id(t) for t in opened}
    for tensor in _external_tensors(proto):
        info = _external_info(tensor)
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
        if checked is not None and id(tensor) not in checked:
            continue
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


def _external_info(tensor: onnx.TensorProto) -> onnx.external_data_helper.ExternalDataInfo:
    """The tensor's external data fields; an offset or length that is no byte count is refused."""
    try:
        return onnx.external_data_helper.ExternalDataInfo(tensor)
    except ValueError as e:  # onnx: a negative offset, int('abc')...
        fields = {entry.key: entry.value for entry in tensor.external_data}
        raise ModelLoadError(f"tensor {tensor.name!r}: invalid external data {fields}: {e}") from None


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
