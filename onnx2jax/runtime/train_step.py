"""An optax training step for any executable, parameters and optimizer state kept where they live.

>>> step = train_step(compiled, loss_fn, optax.adam(1e-3))                        # doctest: +SKIP
>>> trained = {k: compiled.params[k] for k in compiled.trainable}                 # doctest: +SKIP
>>> state = step.init(trained)                                                    # doctest: +SKIP
>>> trained, state, loss = step(trained, state, ids, loss_args=(ids,))            # doctest: +SKIP

The gradient is the executable's ``value_and_grad(loss_fn)``; the update a
jitted ``optimizer.update`` + ``optax.apply_updates`` per group of
parameters held by the same devices. One SPMD program
(:class:`~onnx2jax.runtime.spmd.Compiled`) is one group. On pipeline stages
each stage's device group is one: each group has
its own optimizer state, created and updated by a program jitted on those
devices, so no parameter and no moment ever leaves its stage. An optimizer
that needs a statistic over every parameter (``optax.clip_by_global_norm``)
sees one stage's parameters at a time there.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import optax


class TrainStep:
    """``step(params, state, *inputs, loss_args=(), **named) -> (params, state, loss)``; ``step.init(params)``."""

    def __init__(self, executable: Any, loss_fn: Callable[..., Any], optimizer: optax.GradientTransformation):
        self.executable = executable
        self.optimizer = optimizer
        self.grad = executable.value_and_grad(loss_fn)

        def update(params, grads, state):
            updates, state = optimizer.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        self._update = jax.jit(update)
        self._init = jax.jit(optimizer.init)

    @staticmethod
    def _groups(params: Mapping[str, Any]) -> list[list[str]]:
        """The parameter names per device set, in first-seen order."""
        groups: dict[frozenset, list[str]] = {}
        for name, value in params.items():
            groups.setdefault(frozenset(value.sharding.device_set), []).append(name)
        return list(groups.values())

    def init(self, params: Mapping[str, Any]) -> tuple:
        """The optimizer state: one per device group of ``params``, each on its group's devices."""
        return tuple(self._init({k: params[k] for k in names}) for names in self._groups(params))

    def __call__(
        self, params: Mapping[str, Any], state: Sequence[Any], *inputs: Any, loss_args: Sequence[Any] = (), **named: Any
    ) -> tuple[dict[str, Any], tuple, Any]:
        loss, grads = self.grad(params, *inputs, loss_args=loss_args, **named)
        new: dict[str, Any] = {}
        states = []
        for names, group_state in zip(self._groups(params), state):
            group, group_state = self._update({k: params[k] for k in names}, {k: grads[k] for k in names}, group_state)
            new.update(group)
            states.append(group_state)
        return {k: new[k] for k in params}, tuple(states), loss

    def lower(
        self, params: Mapping[str, Any], *inputs: Any, loss_args: Sequence[Any] = (), **named: Any
    ) -> list[jax.stages.Lowered]:
        """The programs one step runs, lowered without placing anything: the gradient's
        (``value_and_grad(loss_fn).lower``), then the optimizer's update per device group, over ``params``
        as ShapeDtypeStructs with their shardings (``{k: compiled.abstract_params[k] for k in
        compiled.trainable}``: a TPU target's too) and the optimizer state's shapes. Inputs as the
        gradient's ``lower`` takes them."""
        programs = [self.grad.lower(params, *inputs, loss_args=loss_args, **named)]
        for names in self._groups(params):
            group = {k: params[k] for k in names}
            state = jax.eval_shape(self.optimizer.init, group)
            programs.append(self._update.lower(group, group, state))
        return programs


def train_step(executable: Any, loss_fn: Callable[..., Any], optimizer: optax.GradientTransformation) -> TrainStep:
    """A :class:`TrainStep` of ``optimizer`` on ``executable.value_and_grad(loss_fn)`` (see the module docstring)."""
    return TrainStep(executable, loss_fn, optimizer)


__all__ = ["TrainStep", "train_step"]
