"""Checkpoints of sharded training state (parameters, optimizer state) with Orbax, restored onto any mesh.

>>> onnx2jax.checkpoint.save("/ckpt/step_100", {"params": params, "opt": opt_state})   # doctest: +SKIP
>>> like = {"params": tp2.params, "opt": optimizer.init(tp2.params)}                    # doctest: +SKIP
>>> state = onnx2jax.checkpoint.restore("/ckpt/step_100", like)                         # doctest: +SKIP

Each device writes and reads only its own slices (Orbax's tensorstore arrays).
Restoring takes a tree shaped like the saved one whose leaves say where each
array goes (placed arrays, or ``jax.ShapeDtypeStruct`` with a sharding): the
same model compiled for another mesh (TP 8 -> TP 2, or one device) gives its
``params`` and an optimizer's ``init`` of them. The arrays are saved as
``Compiled.params`` holds them; a target that stores a parameter in another
layout (unfused, or padded to divide evenly) is refused by the shape check.

Orbax (``orbax-checkpoint``, the ``train`` extra) is imported on first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - orbax comes with flax today
        raise ImportError("onnx2jax.checkpoint needs orbax-checkpoint: pip install 'onnx2jax[train]'") from error
    return ocp


def save(path: str | os.PathLike, state: Any) -> None:
    """Writes ``state`` (a pytree of jax.Arrays, sharded or not) to the new directory ``path``, and waits for it.

    Raises:
      ValueError: ``path`` exists (Orbax never overwrites).
    """
    path = Path(path).absolute()
    if path.exists():
        raise ValueError(f"{path} exists: a checkpoint is written to a new directory")
    ocp = _orbax()
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, state)
        checkpointer.wait_until_finished()


def _target(leaf: Any) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def restore(path: str | os.PathLike, like: Any) -> Any:
    """The state saved at ``path``, each array placed as the matching leaf of ``like``.

    Args:
      path: a directory :func:`save` wrote.
      like: a pytree with the saved tree's structure whose leaves are placed
        jax.Arrays or ``jax.ShapeDtypeStruct`` with a sharding (any mesh).

    Raises:
      ValueError: a leaf's shape or dtype differs from the saved array's.
    """
    ocp = _orbax()
    abstract = jax.tree.map(_target, like)
    with ocp.StandardCheckpointer() as checkpointer:
        return checkpointer.restore(Path(path).absolute(), abstract)


__all__ = ["restore", "save"]
