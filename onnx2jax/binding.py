"""A model's inputs and how a call's arguments bind to them: one binding for every way of running.

:class:`InputInfo` is what a graph input declares (name, dtype, shape);
:func:`bind_inputs` maps positional and named arguments onto those inputs and
checks dtype and rank, for a :class:`~onnx2jax.translate.JaxModel`, a
compiled program and a pipeline's whole-model interface alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import onnx
import onnx.helper

from onnx2jax.errors import InputError
from onnx2jax.ops.ml_maps import MapValue


@dataclasses.dataclass
class InputInfo:
    """A graph input: its name, ONNX dtype and shape (ints, dim_param strings or None).

    A map input (``is_map``) has its values' dtype and no shape.
    """

    name: str
    dtype: np.dtype | None
    shape: tuple[int | str | None, ...] | None
    is_map: bool = False


def input_info(info: onnx.ValueInfoProto) -> InputInfo:
    """A graph input's name, numpy dtype and shape (ints, dim_param strings or None) from its ValueInfo."""
    if info.type.HasField("map_type"):
        values = info.type.map_type.value_type.tensor_type.elem_type
        return InputInfo(info.name, onnx.helper.tensor_dtype_to_np_dtype(values) if values else None, None, True)
    tt = info.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else None
    shape = None
    if tt.HasField("shape"):
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim
        )
    return InputInfo(info.name, dtype, shape)


def bind_inputs(infos: Sequence[InputInfo], inputs: Sequence[Any], named: Mapping[str, Any]) -> dict[str, Any]:
    """Maps positional and named arguments onto the inputs ``infos``, checking dtype and rank.

    One binding for every way of running a model (a JaxModel, a compiled
    program, a pipeline's whole-model interface).

    Raises:
      onnx2jax.errors.InputError (a TypeError): missing, extra or ill-typed inputs, naming each.
    """
    names = [info.name for info in infos]
    if len(inputs) > len(infos):
        raise InputError(f"model takes {len(infos)} inputs {names}, got {len(inputs)}")
    bound = {info.name: value for info, value in zip(infos, inputs)}
    for name, value in named.items():
        if name in bound:
            raise InputError(f"input {name!r} given twice")
        if name not in names:
            raise InputError(f"unknown input {name!r}; the model's inputs are {names}")
        bound[name] = value
    absent = [name for name in names if name not in bound]
    if absent:
        raise InputError(f"missing inputs {absent}")
    for info in infos:
        if info.is_map:
            bound[info.name] = _map_input(info, bound[info.name])
        _check_input(info, bound[info.name])
    return bound


def _map_input(info: InputInfo, value: Any) -> MapValue:
    """A dict given for a map input, as the MapValue the ops that read maps take (:mod:`onnx2jax.ops.ml_maps`)."""
    if isinstance(value, MapValue):
        return value
    if not isinstance(value, Mapping):
        raise InputError(f"input {info.name!r} is a map: give a dict, got {type(value).__name__}")
    return MapValue.of(value, info.dtype)


def _check_input(info: InputInfo, value: Any) -> None:
    if value is None:
        return
    dtype = getattr(value, "dtype", None)
    if info.dtype is not None and dtype is not None and np.dtype(dtype) != info.dtype:
        raise InputError(f"input {info.name!r}: expected dtype {info.dtype}, got {np.dtype(dtype)}")
    shape = getattr(value, "shape", None)
    if info.shape is not None and shape is not None:
        if len(shape) != len(info.shape):
            raise InputError(f"input {info.name!r}: expected rank {len(info.shape)} {info.shape}, got shape {tuple(shape)}")
        for axis, (want, got) in enumerate(zip(info.shape, shape)):
            if isinstance(want, int) and want > 0 and want != got:
                raise InputError(f"input {info.name!r}: axis {axis} must be {want}, got shape {tuple(shape)}")


__all__ = ["InputInfo", "bind_inputs", "input_info"]
