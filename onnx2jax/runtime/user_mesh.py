"""Meshes as JAX users make them: Explicit and Auto axes, and ``jax.set_mesh`` contexts.

Since jax 0.9, ``jax.make_mesh`` gives *Explicit* axes by default (sharding in
types: every op checks its operands' shardings, and ``with_sharding_constraint``
only asserts). An ONNX graph carries no sharding types: onnx2jax says where
values live with ``with_sharding_constraint`` and lets XLA's partitioner move
the data, which is what *Auto* axes mean. So a compiled model

- runs on the user's mesh with the same devices and axis names, every axis
  Auto (:func:`auto_axes`);
- uses the mesh of an enclosing ``with jax.set_mesh(mesh):`` when it is given
  none (:func:`context_mesh`);
- is traced under its own mesh whatever mesh the caller has set
  (:func:`tracing`), so an Explicit context mesh never reaches the trace;
- takes inputs already sharded on a mesh with Explicit axes as they are: they
  are relabelled onto the same devices and spec with Auto axes, which moves
  no data (:func:`auto_input`).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax
from jax.sharding import AxisType, Mesh, NamedSharding


def auto_axes(mesh: Mesh | None) -> Mesh | None:
    """``mesh`` with every axis Auto (same devices, same axis names); None stays None."""
    if mesh is None or all(t == AxisType.Auto for t in mesh.axis_types):
        return mesh
    return Mesh(mesh.devices, mesh.axis_names, axis_types=(AxisType.Auto,) * len(mesh.axis_names))


def context_mesh() -> Mesh | None:
    """The mesh of an enclosing ``jax.set_mesh(...)``, or None outside one."""
    mesh = jax.sharding.get_mesh()
    return None if mesh.empty else mesh


@contextlib.contextmanager
def tracing(mesh: Mesh) -> Iterator[None]:
    """Traces under ``mesh``'s (Auto) abstract mesh, hiding any mesh the caller has set.

    ``use_abstract_mesh`` rather than ``set_mesh``: it also works inside a
    caller's ``jax.jit``.
    """
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        yield


def auto_input(value: Any) -> Any:
    """A jax.Array sharded on a mesh with Explicit axes, relabelled with Auto axes (no copy)."""
    sharding = getattr(value, "sharding", None)
    if not isinstance(value, jax.Array) or isinstance(value, jax.core.Tracer):
        return value
    if not isinstance(sharding, NamedSharding) or all(t == AxisType.Auto for t in sharding.mesh.axis_types):
        return value
    return jax.device_put(value, NamedSharding(auto_axes(sharding.mesh), sharding.spec))
