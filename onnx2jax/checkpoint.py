"""Checkpoints of sharded training state (parameters, optimizer state) with Orbax, restored onto any mesh.

>>> onnx2jax.checkpoint.save("/ckpt/step_100", {"params": params, "opt": opt_state})   # doctest: +SKIP
>>> like = {"params": tp2.params, "opt": optimizer.init(tp2.params)}                    # doctest: +SKIP
>>> state = onnx2jax.checkpoint.restore("/ckpt/step_100", like)                         # doctest: +SKIP

Each device writes and reads only its own slices (Orbax's tensorstore arrays).
Restoring takes a tree shaped like the saved one whose leaves say where each
array goes (placed arrays, or ``jax.ShapeDtypeStruct`` with a sharding): the
same model compiled for another mesh (TP 8 -> TP 2, or one device) gives its
``params`` and an optimizer's ``init`` of them.

Without ``compiled``, the arrays are saved as ``Compiled.params`` holds them,
and a target that holds a parameter in another layout (GPT-2's fused q|k|v
weight ``[64, 192]`` is held ``[64, 3, 64]`` under TP 4, one device holds it
as is) is refused by the shape check. With ``compiled=`` (the program the
state belongs to) ``save`` writes every parameter's leaves at the ONNX
initializer's shape (``Compiled.logical``) and ``restore`` reads them back
into the target program's layout (``Compiled.held``), so a checkpoint moves
between any meshes:

>>> onnx2jax.checkpoint.save("/ckpt/step_100", state, compiled=tp4)              # doctest: +SKIP
>>> state = onnx2jax.checkpoint.restore("/ckpt/step_100", like, compiled=one)  # doctest: +SKIP

A parameter held in another layout is then read whole by each device of the
target and cut into place (no sharding of the ONNX shape gives each device
only its slice of a fused axis); the others are read slice by slice.

Orbax (``orbax-checkpoint``, the ``train`` extra) is imported on first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

if TYPE_CHECKING:
    from onnx2jax.runtime.spmd import Compiled


def _orbax():
    try:
        import orbax.checkpoint as ocp
    except ImportError as error:  # pragma: no cover - orbax comes with flax today
        raise ImportError(
            "onnx2jax.checkpoint needs orbax-checkpoint: pip install orbax-checkpoint"
            " (or pip install -e '.[train]' from a clone of onnx2jax)"
        ) from error
    return ocp


def _layouts(compiled: Any) -> Any:
    """``compiled`` when it can fold its parameters' layouts (a one-program ``Compiled``), else a TypeError."""
    if not callable(getattr(compiled, "logical", None)) or not callable(getattr(compiled, "held", None)):
        raise TypeError(
            f"compiled= takes a one-program onnx2jax Compiled (it has logical and held), not "
            f"{type(compiled).__name__}: a pipeline's stages or a run in segments hold their parameters apart"
        )
    return compiled


def save(path: str | os.PathLike, state: Any, *, compiled: Compiled | None = None) -> None:
    """Writes ``state`` (a pytree of jax.Arrays, sharded or not) to the new directory ``path``, and waits for it.

    Args:
      path: a directory that does not exist yet.
      state: parameters, optimizer state, anything Orbax's standard checkpointer takes.
      compiled: the program ``state`` is laid out for: its parameters' leaves are
        saved at the ONNX initializers' shapes (``compiled.logical(state)``), a
        layout every mesh can restore. None: saved as held.

    Raises:
      ValueError: ``path`` exists (Orbax never overwrites).
      TypeError: ``compiled`` has no ``logical`` (a pipeline's or a segmented run's program).
    """
    path = Path(path).absolute()
    if path.exists():
        raise ValueError(f"{path} exists: a checkpoint is written to a new directory")
    ocp = _orbax()
    if compiled is not None:
        state = _layouts(compiled).logical(state)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path, state)
        checkpointer.wait_until_finished()


def _target(leaf: Any) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def restore(path: str | os.PathLike, like: Any, *, compiled: Compiled | None = None) -> Any:
    """The state saved at ``path``, each array placed as the matching leaf of ``like``.

    Args:
      path: a directory :func:`save` wrote.
      like: a pytree with the saved tree's structure whose leaves are placed
        jax.Arrays or ``jax.ShapeDtypeStruct`` with a sharding (any mesh).
      compiled: the program ``like`` is laid out for, when the checkpoint was
        saved with ``compiled=`` (at the initializers' shapes): the state comes
        back laid out and placed as ``like`` (``compiled.held``).

    Raises:
      ValueError: a leaf's shape or dtype differs from the saved array's.
      TypeError: ``compiled`` has no ``held`` (a pipeline's or a segmented run's program).
    """
    ocp = _orbax()
    abstract = jax.tree.map(_target, like)
    if compiled is not None:
        abstract = _layouts(compiled).logical(abstract)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(Path(path).absolute(), abstract)
    return restored if compiled is None else compiled.held(restored)


__all__ = ["restore", "save"]
