"""Parameter trees between the layout a program holds and the ONNX initializers' shapes.

``Compiled.params`` holds a parameter with a fused-axis spec unfused (GPT-2's
``[64, 192]`` q|k|v weight as ``[64, 3, 64]`` under TP 4) and one whose
sharded axes do not divide evenly zero-padded
(:mod:`onnx2jax.runtime.parameters`); gradients and an optimizer's state come
back the same way. So the same model compiled for two meshes holds the same
parameter in two shapes, and a checkpoint written in one layout does not
restore in the other. :func:`logical_tree` folds every such leaf of a pytree
(parameters, gradients, optax state keyed by parameter name) to its
initializer's shape, which every mesh shares; :func:`held_tree` is its
inverse, laying each leaf out and placing it as the program holds that
parameter.

A leaf belongs to parameter ``name`` when the innermost dict key on its path is
``name`` (``params[name]``, Adam's ``mu[name]``): leaves elsewhere (Adam's
step count) and leaves of another shape (a factored second moment) are left
as they are.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from onnx2jax.runtime.parameters import ParameterStore, StoredLayout


def _owner(path: tuple, params: Mapping[str, Any]) -> str | None:
    """The parameter a leaf at ``path`` belongs to: its innermost dict key, when that names a parameter."""
    for entry in reversed(path):
        if isinstance(entry, jax.tree_util.DictKey):
            return entry.key if isinstance(entry.key, str) and entry.key in params else None
    return None


def _map(tree: Any, params: Mapping[str, Any], fn: Callable[[str, Any], Any]) -> Any:
    def leaf(path: tuple, value: Any) -> Any:
        name = _owner(path, params)
        return value if name is None else fn(name, value)

    return jax.tree_util.tree_map_with_path(leaf, tree, is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))


def _fold(layout: StoredLayout, value: Any) -> Any:
    if layout.padded_shape != layout.unfused_shape:
        value = value[tuple(slice(0, s) for s in layout.unfused_shape)]
    return jnp.reshape(value, layout.logical_shape)


def logical_tree(store: ParameterStore, params: Mapping[str, jax.Array], tree: Any) -> Any:
    """``tree`` with every leaf held in a parameter's stored layout folded to the initializer's shape.

    A ``jax.ShapeDtypeStruct`` leaf (a restore target) becomes one of the
    initializer's shape, replicated on the parameter's mesh: a fused layout
    has no sharding at the ONNX shape that gives each device its own slice.
    """

    def fold(name: str, value: Any) -> Any:
        layout = store.layouts.get(name)
        if layout is None or tuple(value.shape) != layout.padded_shape:
            return value
        if isinstance(value, jax.ShapeDtypeStruct):
            mesh = params[name].sharding.mesh
            return jax.ShapeDtypeStruct(layout.logical_shape, value.dtype, sharding=NamedSharding(mesh, PartitionSpec()))
        return _fold(layout, value)

    return _map(tree, params, fold)


def held_tree(store: ParameterStore, params: Mapping[str, jax.Array], tree: Any) -> Any:
    """The inverse of :func:`logical_tree`: each parameter's leaf laid out and placed as ``params`` holds it.

    A leaf of the initializer's shape is unfused and zero-padded as stored; a
    leaf of the held shape is kept; either is put on the parameter's sharding
    (``jax.device_put``, from any device or host array).
    """

    def unfold(name: str, value: Any) -> Any:
        held = params[name]
        layout = store.layouts.get(name)
        shape = tuple(value.shape)
        logical = layout is not None and shape == layout.logical_shape
        if not logical and shape != tuple(held.shape):
            return value
        if isinstance(value, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(held.shape, value.dtype, sharding=held.sharding)
        if logical:
            value = jnp.reshape(value, layout.unfused_shape)
            pad = [(0, p - u) for p, u in zip(layout.padded_shape, layout.unfused_shape)]
            if any(after for _, after in pad):
                value = jnp.pad(value, pad)
        return jax.device_put(value, held.sharding)

    return _map(tree, params, unfold)


__all__ = ["held_tree", "logical_tree"]
