"""A compiled program's parameters, planned first and placed on demand: :class:`PlacedParameters`.

:class:`~onnx2jax.runtime.spmd.Compiled` plans every stored layout at compile time
(:class:`~onnx2jax.runtime.parameters.ParameterStore`, from shapes and dtypes only) and places the host
arrays when something needs them on the devices: :meth:`PlacedParameters.place`, the first call, or the
first read of ``params``. Lowering, compiling and reports use :attr:`PlacedParameters.abstract_params`
instead, so a program compiles for devices that cannot hold data (a TPU topology's compile-only devices:
:mod:`onnx2jax.runtime.targets`), where placing raises :class:`~onnx2jax.errors.NoDevicesError`.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding

from onnx2jax.errors import NoDevicesError
from onnx2jax.loading import host_array
from onnx2jax.runtime.parameters import ParameterStore
from onnx2jax.runtime.scan_sharded import place_stacked


class PlacedParameters:
    """The parameter half of a compiled program (a mixin of :class:`~onnx2jax.runtime.spmd.Compiled`).

    Expects: ``_store`` (the planned layouts), ``_host_params`` (the host arrays by name, or
    :class:`~onnx2jax.loading.ExternalTensor`), ``_stacked_shardings`` (a scanned model's stacked
    parameters' shardings), ``model`` (its ``_stacked`` slots), ``target`` (None, or the name of a target
    whose devices are not attached) and ``_placed`` (a dict, empty until placed: shared by shallow copies,
    ``Compiled.with_trainable``'s, so that they place once between them).
    """

    _store: ParameterStore
    _host_params: Mapping[str, Any]
    _stacked_shardings: Mapping[str, NamedSharding]
    _placed: dict[str, dict[str, jax.Array]]
    target: str | None
    model: Any

    def place(self) -> "PlacedParameters":
        """Places the parameters on the mesh as planned (once; the first call or :attr:`params` does it too).

        Raises:
          NoDevicesError: the mesh's devices are compile-only (a TPU topology): nothing can be placed there.
        """
        if not self._placed:
            if self.target is not None:
                raise NoDevicesError(self.target, "place parameters")
            arrays, copies = self._store.place(self._host_params)
            arrays.update(place_stacked(self.model._stacked, self._stacked_shardings))
            self._placed.update(arrays=arrays, copies=copies)
        return self

    @property
    def params(self) -> dict[str, jax.Array]:
        """The parameters as placed jax.Arrays, by name (placed at the first use: :meth:`place`)."""
        return self.place()._placed["arrays"]

    @property
    def param_copies(self) -> dict[str, jax.Array]:
        """Further copies of parameters whose consumers want other layouts (``"name#k"``), placed."""
        return self.place()._placed["copies"]

    @property
    def abstract_params(self) -> dict[str, jax.ShapeDtypeStruct]:
        """:attr:`params` without data: each a ShapeDtypeStruct with its planned sharding (nothing placed)."""
        arrays, _ = self._store.abstract()
        for key, sharding in self._stacked_shardings.items():
            stacked = self.model._stacked[key]
            arrays[key] = jax.ShapeDtypeStruct(stacked.shape, stacked.dtype, sharding=sharding)
        return arrays

    def host_params(self) -> dict[str, np.ndarray]:
        """:attr:`params` as host arrays in their held layouts, read from the model (not from devices): what an
        artifact for a target whose devices are not attached carries (:func:`onnx2jax.export.export`)."""
        held = {key: self._store.held_on_host(key, self._host_params) for key in self._store.names
                if key == self._store.names[key]}
        for key in self._stacked_shardings:
            held[key] = np.stack([np.asarray(host_array(layer)) for layer in self.model._stacked[key].layers])
        return held

    @property
    def abstract_param_copies(self) -> dict[str, jax.ShapeDtypeStruct]:
        """:attr:`param_copies` without data."""
        return self._store.abstract()[1]


__all__ = ["PlacedParameters"]
