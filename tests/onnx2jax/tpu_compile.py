"""Test helper: a compiled model's program as the TPU compiler makes it, on this CPU machine.

`jax.experimental.topologies.get_topology_desc` gives compile-only TPU devices
(libtpu, the test extra). Until `onnx2jax.compile(target=...)` places nothing by
itself (issue 41, item 1), the parameters are "placed" here as sharded
`jax.ShapeDtypeStruct`s (the store's `place` is swapped for the time of the
compile), the inputs are given the same way, and the translated function is
lowered on a Mesh of the topology's devices and compiled for the TPU.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator, Mapping
from unittest import mock

import jax
import numpy as np
import onnx
from jax.experimental import topologies
from jax.sharding import Mesh

import onnx2jax
import onnx2jax.runtime.parameters


@functools.lru_cache(maxsize=None)
def topology_devices(topology: str = "v5e:2x4") -> tuple:
    """The compile-only devices of a TPU topology (jax's spelling: ``"v5e:2x4"``)."""
    return tuple(topologies.get_topology_desc(topology, platform="tpu").devices)


@contextlib.contextmanager
def _abstract_parameters() -> Iterator[None]:
    """Parameters stored as ShapeDtypeStructs with their shardings (the held, possibly padded shape)."""

    def abstract(array: np.ndarray, sharding: jax.sharding.Sharding, shape: tuple[int, ...] | None = None):
        return jax.ShapeDtypeStruct(tuple(array.shape if shape is None else shape), array.dtype, sharding=sharding)

    with mock.patch.object(onnx2jax.runtime.parameters, "place", abstract):
        yield


def tpu_hlo(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], devices: int,
            topology: str = "v5e:2x4") -> str:
    """The compiled TPU program (HLO text) of ``model`` on the first ``devices`` chips of ``topology``.

    ``inputs`` give the shapes and dtypes only; each is laid out where a call would place it.
    """
    mesh = Mesh(np.array(topology_devices(topology)[:devices]), ("d0",))
    with _abstract_parameters():
        compiled = onnx2jax.compile(model, mesh)
    shardings = compiled.input_shardings({k: v.shape for k, v in inputs.items()})
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in inputs.items()}
    assert {d.platform for d in compiled.mesh.devices.flat} == {"tpu"}  # the program is for the TPU, not CPU
    return compiled.lower(**abstract).compile().as_text()
