"""A compiled model as a portable artifact (``jax.export``): run it later with jax alone, sharded as compiled.

:func:`export` serialises the sharded program ``compiled.apply`` at a call's
input shapes with its parameters; :func:`load` reads it back into an
:class:`Artifact` that places the parameters with the exported shardings on
the first devices of ``jax.devices()`` and calls the program. Loading and
calling need neither onnx nor the translator: this module imports only jax
and numpy at the top (``export`` imports the runtime when it runs).

The file is a zip: ``program.bin`` (``jax.export.Exported.serialize()``),
``params.npz`` (the parameters as ``Compiled.params`` holds them, by position)
and ``meta.json`` (input, output and parameter names, the mesh's shape and
axis names, whether 64-bit types are on). Inputs that set shapes are folded in
at the exported values.

An example input may be a ``jax.ShapeDtypeStruct`` whose shape holds jax's
symbolic dimensions (``jax.export.symbolic_shape("batch")``): the artifact then
takes every size of them. The translator carries them through the model's
shape chains (:mod:`onnx2jax.symbolic`), and a sharded model's per-call
sharding inference sees each as a named dim (a dim_param), as it sees the
model's own symbolic dims at compile time: a split its specs write on such an
axis is kept (XLA pads an uneven last shard inside the program), and no split
is inferred that needs the size. A shape computation whose result depends on
the value of a symbolic dimension (``Equal(batch, 1)``) is refused, naming the node.
"""

from __future__ import annotations

import io
import json
import math
import os
import zipfile
from typing import Any

import jax
import numpy as np

from onnx2jax.x64 import x64_scope

FORMAT = 1


def export(compiled: Any, *inputs: Any, path: str | os.PathLike | None = None, **named: Any) -> bytes:
    """The artifact of ``compiled`` (a :class:`onnx2jax.runtime.spmd.Compiled`) at these example inputs.

    Args:
      compiled: the compiled model.
      inputs, named: example inputs (positional in ONNX order, or by name; arrays or
        ``jax.ShapeDtypeStruct``): their shapes and dtypes are the artifact's; a shape may hold
        symbolic dims (one ``jax.export.symbolic_shape`` scope for all inputs).
      path: where to write it too.

    Returns:
      The artifact's bytes.

    Raises:
      TypeError: ``compiled`` is not one SPMD program (pipeline stages, segments).
    """
    from onnx2jax.ops.contrib_quantization import portable
    from onnx2jax.runtime.spmd import Compiled

    if not isinstance(compiled, Compiled):
        raise TypeError(f"export takes a model compiled to one SPMD program, not a {type(compiled).__name__}")
    model = compiled.model
    bound = {**dict(zip(model.input_names, inputs)), **named}
    static = {k: np.asarray(v) for k, v in bound.items() if k in model.shape_input_names}
    dynamic = [k for k in model.input_names if k in bound and k not in static]
    # For a target whose devices are not attached (compile-only TPU devices), nothing is placed: the program
    # is lowered for the target's platform over the planned shardings, the weights read from the model file.
    held = compiled.abstract_params if compiled.target is not None else compiled.params
    names = list(held)

    def program(params, *values):
        return compiled.apply(dict(zip(names, params)), **dict(zip(dynamic, values)), **static)

    params = [held[n] for n in names]
    shardings = ([p.sharding for p in params],) + (None,) * len(dynamic)
    platforms = [compiled.mesh.devices.flat[0].platform]
    with x64_scope(model.uses_64bit), portable():
        avals = [_abstract(bound[k]) for k in dynamic]
        exported = jax.export.export(jax.jit(program, in_shardings=shardings), platforms=platforms)(
            [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in params], *avals
        )
    if compiled.target is not None:
        host = compiled.host_params()
        params = [host[n] for n in names]
    meta = {
        "format": FORMAT,
        "inputs": dynamic,
        "outputs": list(model.output_names),
        "params": names,
        "mesh_shape": list(compiled.mesh.devices.shape),
        "axis_names": list(compiled.mesh.axis_names),
        "uses_64bit": bool(model.uses_64bit),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("program.bin", bytes(exported.serialize()))
        arrays = io.BytesIO()
        np.savez(arrays, *[np.asarray(p) for p in params])
        archive.writestr("params.npz", arrays.getvalue())
        archive.writestr("meta.json", json.dumps(meta, indent=1))
    data = buffer.getvalue()
    if path is not None:
        with open(path, "wb") as file:
            file.write(data)
    return data


def _abstract(value: Any) -> jax.ShapeDtypeStruct:
    """An example input's shape and dtype (an array, or already a ``jax.ShapeDtypeStruct``)."""
    if isinstance(value, jax.ShapeDtypeStruct):
        return value
    value = np.asarray(value)
    return jax.ShapeDtypeStruct(value.shape, value.dtype)


class Artifact:
    """An exported model, loaded: call it like the model (inputs in ONNX order or by name).

    Attributes:
      exported: the ``jax.export.Exported`` program.
      mesh: the mesh it runs on: the first devices of ``jax.devices()``, shaped as exported.
      params: the parameters placed with the exported shardings.
      input_names, output_names: the model's runtime inputs and outputs.
    """

    def __init__(self, exported: jax.export.Exported, params: list[np.ndarray], meta: dict):
        count = math.prod(meta["mesh_shape"])
        if len(jax.devices()) < count:
            raise ValueError(f"the artifact runs on {count} devices; JAX has {len(jax.devices())}")
        devices = np.array(jax.devices()[:count]).reshape(meta["mesh_shape"])
        self.exported = exported
        self.mesh = jax.sharding.Mesh(devices, tuple(meta["axis_names"]))
        self.input_names: list[str] = meta["inputs"]
        self.output_names: list[str] = meta["outputs"]
        self._uses_64bit = meta["uses_64bit"]
        shardings = exported.in_shardings_jax(self.mesh)[: len(params)]
        with x64_scope(self._uses_64bit):
            self.params = [jax.device_put(p, s) for p, s in zip(params, shardings)]

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """The model's outputs, in ONNX order."""
        bound = {**dict(zip(self.input_names, inputs)), **named}
        missing = [n for n in self.input_names if n not in bound]
        if missing:
            raise TypeError(f"missing inputs: {missing}")
        with x64_scope(self._uses_64bit):
            return tuple(self.exported.call(self.params, *[bound[n] for n in self.input_names]))


def load(path: str | os.PathLike) -> Artifact:
    """Reads an artifact :func:`export` wrote.

    Raises:
      ValueError: not an artifact of this format, or fewer devices than it runs on.
    """
    with zipfile.ZipFile(path) as archive:
        meta = json.loads(archive.read("meta.json"))
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: artifact format {meta.get('format')!r}, this onnx2jax reads {FORMAT}")
        exported = jax.export.deserialize(bytearray(archive.read("program.bin")))
        with np.load(io.BytesIO(archive.read("params.npz"))) as arrays:
            params = [arrays[f"arr_{i}"] for i in range(len(meta["params"]))]
    return Artifact(exported, params, meta)


__all__ = ["Artifact", "export", "load"]
