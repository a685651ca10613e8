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

:func:`per_device_group` is the same split as an optax transformation, for
code that drives the optimizer itself (``nnx.Optimizer`` over a pipelined
:class:`onnx2jax.nnx.OnnxModule`): a plain ``optax.adam`` there fails, since
its jitted bias correction takes the moments of every stage at once and JAX
refuses arrays of disjoint device sets in one program.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import optax


def _device_groups(leaves: Sequence[Any]) -> list[list[int]]:
    """The indices of ``leaves`` per set of devices holding them, in first-seen order."""
    groups: dict[frozenset, list[int]] = {}
    for index, leaf in enumerate(leaves):
        groups.setdefault(frozenset(leaf.sharding.device_set), []).append(index)
    return list(groups.values())


def _only(treedef: Any, leaves: Sequence[Any], indices: Sequence[int]) -> Any:
    """The tree with the leaves at ``indices`` and None (an empty subtree) everywhere else."""
    keep = set(indices)
    return treedef.unflatten([leaf if index in keep else None for index, leaf in enumerate(leaves)])


def per_device_group(optimizer: optax.GradientTransformation) -> optax.GradientTransformationExtraArgs:
    """``optimizer`` run once per group of parameters held by the same devices, each group's state on its devices.

    ``init(params)`` splits the leaves of ``params`` by their device set (first
    seen first) and returns a tuple of ``optimizer.init`` states, one per group,
    each made by a program jitted on the group's devices (so scalars such as
    Adam's step count live there too). ``update(updates, state, params)``
    updates each group in a program jitted on its devices and returns the
    updates as one tree. Each group is given the whole tree with the other
    groups' leaves as None (empty subtrees), so masks and labels by name still
    see the names. On one device set it is ``optimizer`` in one jitted program.

    Args:
      optimizer: any optax transformation; extra keyword arguments of its
        ``update`` go to every group.

    Raises:
      ValueError: ``update`` got parameters split otherwise than ``init``'s
        (another count of device groups).
    """
    init_group = jax.jit(optimizer.init)
    update_group = jax.jit(optimizer.update)

    def init(params: Any) -> tuple:
        leaves, treedef = jax.tree.flatten(params)
        return tuple(init_group(_only(treedef, leaves, group)) for group in _device_groups(leaves))

    def update(updates: Any, state: tuple, params: Any = None, **extra: Any) -> tuple[Any, tuple]:
        leaves, treedef = jax.tree.flatten(updates)
        param_leaves = None if params is None else treedef.flatten_up_to(params)
        groups = _device_groups(leaves if param_leaves is None else param_leaves)
        if len(groups) != len(state):
            raise ValueError(
                f"per_device_group: the parameters lie on {len(groups)} device groups, the state was made for {len(state)}"
            )
        new_leaves: list[Any] = list(leaves)
        new_state = []
        for group, group_state in zip(groups, state):
            group_params = None if param_leaves is None else _only(treedef, param_leaves, group)
            group_updates, group_state = update_group(_only(treedef, leaves, group), group_state, group_params, **extra)
            for index, leaf in zip(group, jax.tree.leaves(group_updates)):
                new_leaves[index] = leaf
            new_state.append(group_state)
        return treedef.unflatten(new_leaves), tuple(new_state)

    return optax.GradientTransformationExtraArgs(init, update)


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
        names = list(params)
        return [[names[index] for index in group] for group in _device_groups(list(params.values()))]

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


__all__ = ["TrainStep", "per_device_group", "train_step"]
