"""An ONNX model as a flax NNX module: its trainable initializers are ``nnx.Param``s, sharded as compiled.

>>> from flax import nnx
>>> module = onnx2jax.nnx.from_onnx("llama_tp8.onnx")                      # doctest: +SKIP
>>> optimizer = nnx.Optimizer(module, optax.adam(1e-3), wrt=nnx.Param)     # doctest: +SKIP
>>> loss, grads = nnx.value_and_grad(loss_fn)(module)                      # doctest: +SKIP
>>> optimizer.update(module, grads)                                        # doctest: +SKIP

The module runs :meth:`onnx2jax.runtime.spmd.Compiled.apply` over its
variables: the same sharded program as the compiled model. Which
initializers are parameters is :mod:`onnx2jax.trainable`'s rule (or the
``trainable`` names given); the others are :class:`Constant` variables, which
``nnx.value_and_grad`` and ``nnx.Optimizer(..., wrt=nnx.Param)`` leave alone.
Each variable holds its placed jax.Array and carries its PartitionSpec as
nnx's sharding metadata (``out_sharding`` and ``mesh``:
``nnx.get_partition_spec`` reads them), so an optimizer's state is created sharded like the parameters.

A model with pipeline stages (:class:`onnx2jax.runtime.pipeline.PipelineCompiled`)
is a module too, each variable on its own stage's devices; JAX cannot trace
it whole (``nnx.jit`` of it raises ``PipelineJitError``), so its gradient is
:meth:`OnnxModule.value_and_grad`, which runs the pipeline's schedule:

>>> optimizer = nnx.Optimizer(module, per_device_group(optax.adam(1e-3)), wrt=nnx.Param)  # doctest: +SKIP
>>> loss, grads = module.value_and_grad(loss_fn)(ids, loss_args=(ids,))   # doctest: +SKIP
>>> optimizer.update(module, grads)                                        # doctest: +SKIP

Its optimizer is wrapped in :func:`per_device_group` (exported here): each
stage's state is made and updated by a program on that stage's devices. A bare
``optax.adam`` fails there at the first update, since its bias correction is
one jitted program over every stage's moments.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Sequence

import jax
import onnx
from flax import nnx

from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.pipeline import PipelineCompiled
from onnx2jax.runtime.spmd import Compiled
from onnx2jax.runtime.train_step import per_device_group


class Constant(nnx.Variable):
    """An initializer that is not trained: shapes and indices, masks, rotary tables, folded scalars."""


def _spec(array: jax.Array) -> tuple:
    spec = tuple(getattr(array.sharding, "spec", ()))
    return spec + (None,) * (array.ndim - len(spec))


class OnnxModule(nnx.Module):
    """A compiled ONNX model whose initializers are nnx variables; call it like the model.

    Attributes:
      compiled: the :class:`~onnx2jax.runtime.spmd.Compiled` program, or the
        :class:`~onnx2jax.runtime.pipeline.PipelineCompiled` stages (static).
      params: every initializer by name (as laid out in ``compiled.params``):
        ``nnx.Param`` for the trainable ones, :class:`Constant` for the others.
    """

    def __init__(self, compiled: Compiled | PipelineCompiled):
        self.compiled = nnx.static(compiled)
        trainable = set(compiled.trainable)
        self.params = nnx.Dict(
            {
                name: (nnx.Param if name in trainable else Constant)(  # each on its mesh (a pipeline: its stage's)
                    value, out_sharding=_spec(value), mesh=value.sharding.mesh, eager_sharding=False  # placed already
                )
                for name, value in compiled.params.items()
            }
        )

    @property
    def _uses_64bit(self) -> bool:
        compiled = self.compiled
        return compiled.uses_64bit if isinstance(compiled, PipelineCompiled) else compiled.model.uses_64bit

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple[Any, nnx.State]]:
        """``(*inputs, loss_args=(), **named) -> (loss, grads)`` of the ``nnx.Param``s, as ``nnx.Optimizer.update`` takes them.

        The compiled model's ``value_and_grad(loss_fn)`` (``loss_fn(outputs,
        *loss_args)``) at the module's current values: one jitted program, or a
        pipeline's schedule. ``grads`` is an ``nnx.State`` shaped like
        ``nnx.state(module, nnx.Param)``.
        """
        grad = self.compiled.value_and_grad(loss_fn)

        def run(*inputs: Any, loss_args: Sequence[Any] = (), **named: Any) -> tuple[Any, nnx.State]:
            state = nnx.state(self, nnx.Param)
            values = self.values()
            trained = {name: values[name] for name in state["params"]}
            loss, grads = grad(trained, *inputs, loss_args=loss_args, **named)
            nnx.replace_by_pure_dict(state, {"params": grads})
            return loss, state

        return run

    def values(self) -> dict[str, Any]:
        """Every initializer's current value by name."""
        return {name: variable[...] for name, variable in self.params.items()}

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """The model's outputs (ONNX order) with the module's current parameters; traceable, differentiable."""
        with x64_scope(self._uses_64bit):
            return self.compiled.apply(self.values(), *inputs, **named)

    def to_onnx(self, path: str | os.PathLike | None = None, *, external_data: bool | None = None) -> onnx.ModelProto:
        """The ONNX model with the module's current parameters (:meth:`Compiled.to_onnx`)."""
        return self.compiled.to_onnx(self.values(), path, external_data=external_data)


def from_onnx(
    model: Any, mesh: jax.sharding.Mesh | None = None, *, trainable: Iterable[str] | None = None, **options: Any
) -> OnnxModule:
    """Compiles ``model`` (:func:`onnx2jax.compile`, with ``mesh`` and ``options``) as an NNX module.

    Args:
      model: a path, bytes or ModelProto, annotated for a mesh or not.
      mesh: as :func:`onnx2jax.compile`'s.
      trainable: the initializers to make ``nnx.Param``s; None: the rule of
        :mod:`onnx2jax.trainable`.
      options: further keyword arguments of :func:`onnx2jax.compile`.

    Raises:
      TypeError: the model compiles to segments (a gradient does not cross their host steps).
    """
    from onnx2jax.runtime.compile import compile as compile_model

    compiled = compile_model(model, mesh, **options)
    if not isinstance(compiled, (Compiled, PipelineCompiled)):
        raise TypeError(
            f"from_onnx takes a model that compiles to one SPMD program or pipeline stages, not a {type(compiled).__name__}"
        )
    if trainable is not None:
        compiled = compiled.with_trainable(trainable)
    return OnnxModule(compiled)


__all__ = ["Constant", "OnnxModule", "from_onnx", "per_device_group"]
