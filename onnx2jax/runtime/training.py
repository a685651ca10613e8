"""What a compiled program's parameters are to training: which to train, and writing them back into ONNX.

:class:`~onnx2jax.runtime.spmd.Compiled` holds its parameters as placed
(fused views unfused, uneven ones padded, a scanned model's layers stacked
under ``scan/<slot>``). Here those keys are related to the ONNX initializers:
:func:`trainable_keys` applies :mod:`onnx2jax.trainable`'s rule to them and
:func:`initializer_values` folds (trained) parameters back into ONNX's names
and shapes, which :func:`write_onnx` writes into a copy of the model with its
annotations.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper
from onnx import numpy_helper

from onnx2jax.errors import ParameterError
from onnx2jax.trainable import trainable_names, unknown_parameters

if TYPE_CHECKING:
    from onnx2jax.runtime.spmd import Compiled

#: Without ``external_data`` given: a model whose initializers pass this many bytes keeps them outside
#: the .onnx file (protobuf refuses messages over 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30

#: With external data: tensors of at least this many bytes go to the .data file.
EXTERNAL_TENSOR_BYTES = 1024


def _stacked_slots(compiled: "Compiled") -> dict[str, tuple[str, ...]]:
    """Per stacked parameter key of a scanned model, its per-layer initializer names (layer order)."""
    scan = compiled.model.scan
    if not scan.active:
        return {}
    return {scan.stacked_key(slot): tuple(names) for slot, names in scan.repetition.stacked.items()}


def trainable_keys(compiled: "Compiled") -> tuple[str, ...]:
    """The keys of ``compiled.params`` that :func:`onnx2jax.trainable.trainable_names` calls trainable.

    A stacked key (scanned layers) is trainable when every layer's initializer is.
    """
    model = compiled.model
    names = set(trainable_names(compiled.plan.proto, {**model.constants, **model.params}))
    stacked = _stacked_slots(compiled)
    return tuple(
        key for key in compiled.abstract_params  # the keys of params, nothing placed (a target's too)
        if (all(n in names for n in stacked[key]) if key in stacked else key in names)
    )


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(value))  # np.shape reads .shape first: a tracer's too


def full_params(compiled: "Compiled", params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters an ``apply`` traces with: ``params`` over the executable's own placed ones.

    ``params`` may be any subset of ``compiled.params`` (the trainable ones, say): the others are
    taken from the executable, constants of the trace, so gradients flow to the given ones alone.
    Each given value must have the shape ``compiled.params`` holds it in (its stored layout).

    Raises:
      ParameterError: a name that is not a parameter, or a value of another shape, naming the
        parameter with the expected and the given shape.
    """
    target = getattr(compiled, "target", None)
    own = compiled.params if target is None else compiled.abstract_params  # a target's: nothing placed
    if target is not None and len(params) < len(own):
        from onnx2jax.errors import NoDevicesError

        absent = [name for name in own if name not in params]
        raise NoDevicesError(target, f"take parameters {absent[:3]}{'...' if len(absent) > 3 else ''} from the "
                                     "executable (give apply every parameter, e.g. its abstract_params)")
    unknown = [name for name in params if name not in own]
    if unknown:
        raise ParameterError(f"apply: {unknown_parameters(unknown, own)}")
    for name, value in params.items():
        want, got = tuple(own[name].shape), _shape(value)
        if got != want:
            logical = tuple(compiled.model.params[name].shape) if name in compiled.model.params else want
            held = f" (its ONNX shape {list(logical)}, held padded or unfused)" if logical != want else ""
            raise ParameterError(
                f"apply: parameter {name!r} has shape {list(got)}, expected {list(want)} as compiled.params "
                f"holds it{held}"
            )
    return {**own, **params}


def initializer_values(compiled: "Compiled", params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every initializer's value by ONNX name and shape: ``params`` (laid out as ``compiled.params``) over the model's.

    Stored layouts are folded back (padding removed, fused axes folded), stacked
    layers split into their per-layer initializers, each cast to its
    initializer's dtype.

    Raises:
      ParameterError (a KeyError): a key is not a parameter of the model, or its value's shape
        or dtype is not the one the executable holds it in (``compiled.params``; the initializer's for a
        constant), naming both.
      NotImplementedError: a key is a sparse initializer's.
    """
    model = compiled.model
    values: dict[str, np.ndarray] = {**model.constants, **model.params}
    stacked = _stacked_slots(compiled)
    sparse = {s.values.name for s in compiled.plan.proto.graph.sparse_initializer}
    unknown = [key for key in params if key not in stacked and key not in values and key not in compiled.params]
    if unknown:
        raise ParameterError(f"to_onnx: {unknown_parameters(unknown, compiled.params)}")
    for key, value in params.items():
        if key in sparse:
            raise NotImplementedError(f"{key!r} is a sparse initializer: writing it back is not supported")
        held = compiled.params.get(key)
        want_shape = tuple(held.shape) if held is not None else tuple(values[key].shape)
        want_dtype = np.dtype(held.dtype) if held is not None else values[key].dtype
        got_shape, got_dtype = _shape(value), np.dtype(getattr(value, "dtype", np.asarray(value).dtype))
        if got_shape != want_shape or got_dtype != want_dtype:
            raise ParameterError(
                f"to_onnx: parameter {key!r} is {got_dtype} {list(got_shape)}, expected {want_dtype} "
                f"{list(want_shape)} as compiled.params holds it (the initializer is "
                f"{values[stacked[key][0]].dtype if key in stacked else values[key].dtype}); "
                "onnxruntime would refuse the model it wrote"
            )
        if key in stacked:
            host = np.asarray(value)
            for layer, name in enumerate(stacked[key]):
                values[name] = host[layer].astype(values[name].dtype)
        elif key in values:
            values[key] = np.asarray(compiled._logical_params({key: value})[key]).astype(values[key].dtype)
        else:
            raise KeyError(f"{key!r} is not a parameter of this model")
    return values


def write_onnx(
    proto: onnx.ModelProto,
    values: Mapping[str, np.ndarray],
    path: str | os.PathLike | None = None,
    *,
    external_data: bool | None = None,
) -> onnx.ModelProto:
    """A copy of ``proto`` (annotations, metadata and all) whose initializers hold ``values``.

    Args:
      proto: the model the values belong to.
      values: every initializer's array by name (:func:`initializer_values`).
      path: where to save it; None: only returned.
      external_data: keep tensors of at least ``EXTERNAL_TENSOR_BYTES`` in
        ``<path>.data`` beside the file (onnx's external data); None: when the
        initializers pass ``EXTERNAL_DATA_BYTES``.

    Returns:
      The model with its initializers inline.
    """
    written = onnx.ModelProto()
    written.CopyFrom(proto)
    for tensor in written.graph.initializer:
        # in the initializer's own type: a model run with a compute dtype holds its float32 weights in bf16
        own = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
        tensor.CopyFrom(numpy_helper.from_array(np.asarray(values[tensor.name]).astype(own, copy=False), tensor.name))
    if path is None:
        return written
    path = Path(path)
    if external_data is None:
        external_data = sum(np.asarray(v).nbytes for v in values.values()) >= EXTERNAL_DATA_BYTES
    if external_data:
        location = path.name + ".data"
        (path.parent / location).unlink(missing_ok=True)  # onnx appends to an existing data file
        saved = onnx.ModelProto()
        saved.CopyFrom(written)
        onnx.save_model(
            saved, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
            location=location, size_threshold=EXTERNAL_TENSOR_BYTES,
        )
    else:
        onnx.save_model(written, str(path))
    return written


def parts_to_onnx(
    proto: onnx.ModelProto,
    parts: "Sequence[Compiled | None]",
    params: Mapping[str, Any],
    path: str | os.PathLike | None,
    external_data: bool | None,
) -> onnx.ModelProto:
    """The whole model of a run in parts (pipeline stages, segments) with ``params`` written back.

    Each part folds the entries it holds (:func:`initializer_values`); an
    initializer no part holds keeps the model's value.

    Raises:
      KeyError: a key of ``params`` is no part's parameter.
    """
    values: dict[str, np.ndarray] = {}
    claimed: set[str] = set()
    for part in parts:
        if part is None:
            continue
        own = {k: v for k, v in params.items() if k in part.params}
        claimed.update(own)
        for name, value in initializer_values(part, own).items():
            if name in own or name not in values:
                values[name] = value
    unknown = sorted(set(params) - claimed)
    if unknown:
        raise KeyError(f"not parameters of this model: {unknown}")
    for tensor in proto.graph.initializer:
        if tensor.name not in values:
            values[tensor.name] = numpy_helper.to_array(tensor)
    return write_onnx(proto, values, path, external_data=external_data)


__all__ = [
    "EXTERNAL_DATA_BYTES", "EXTERNAL_TENSOR_BYTES", "full_params", "initializer_values", "parts_to_onnx", "trainable_keys",
    "write_onnx",
]
