"""Pipeline execution: each stage its own SPMD program on its sub-mesh, micro-batches fill-drain.

JAX (0.10) has no public jit across meshes, so a model with
``pipeline_stage`` annotations runs as one program per stage:

1. the stage partition is read from the model (`sharding.stages`) and each
   stage extracted as its own ONNX model (`sharding.partition.extract_part`:
   shape-only tensors such as masks and RoPE tables are recomputed, so the
   residual stream is what crosses);
2. each stage model, its specs moved onto its own device numbering, is
   planned (:func:`onnx2jax.runtime.plan.program_plan`, with the whole
   model's shapes) and compiled as one SPMD program
   (:class:`onnx2jax.runtime.spmd.Compiled`) on the sub-mesh of its devices:
   tensor parallelism inside a stage is exactly what :func:`onnx2jax.compile`
   does, and each stage's parameters live only on its devices. A stage with
   data-dependent output shapes is refused before anything is translated
   (steps 1-2: :func:`onnx2jax.runtime.pipeline_stages.compile_stages`);
3. a call splits the batch (axis 0 of every input) into M micro-batches and
   issues the (stage, micro-batch) steps in the order of its schedule
   (:mod:`onnx2jax.runtime.schedule`; GPipe's fill-drain by default);
   activations move with ``jax.device_put`` to the consumer's sharding.
   Nothing blocks until the outputs are joined, so JAX's asynchronous
   dispatch lets stages on different devices overlap.

Training (``value_and_grad`` by a schedule) is :mod:`onnx2jax.runtime.pipeline_train`; what ``report()``
measures, :mod:`onnx2jax.runtime.pipeline_report`.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx

from onnx2jax.errors import PipelineJitError, ScheduleError
from onnx2jax.runtime.executable import merged_params, part_params
from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.parameters import holdable_sharding
from onnx2jax.runtime.pipeline_report import PipelineReport, measure
from onnx2jax.runtime.pipeline_stages import PipelineModel, Stage, compile_stages
from onnx2jax.runtime.plan import Plan
from onnx2jax.runtime.report import example_inputs
from onnx2jax.runtime.pipeline_schedules import NAMES, PipelineSchedule, build
from onnx2jax.runtime.pipeline_train import PipelineGrad
from onnx2jax.runtime.schedule import GPipe, Schedule, check_order
from onnx2jax.runtime.training import parts_to_onnx
from onnx2jax.trainable import checked_names
from onnx2jax.runtime.sizes_at_call import SizesAtCall
from onnx2jax.binding import bind_inputs
from sharding.diagnostics import Diagnostic
from sharding.partition import Partition


class PipelineCompiled:
    """A model with pipeline stages, compiled one program per stage. Call it like the model.

    Attributes:
      stages: the :class:`Stage` list, in run order.
      microbatches: how many micro-batches a call splits its batch into.
      partition: the stage partition (what crosses between stages).
      model: the whole model's inputs and outputs (a :class:`PipelineModel`).
      params: every stage's parameters as placed jax.Arrays, by name; each
        lives only on its own stage's devices (a parameter two stages read is
        held by both; this map shows the earlier stage's copy).
      schedule: the order of a call's steps: a name of
        :data:`onnx2jax.runtime.pipeline_schedules.NAMES`, a
        :class:`~onnx2jax.runtime.pipeline_schedules.PipelineSchedule`
        (training schedules; a call runs their forwards in order), or a
        forward-only order (:class:`onnx2jax.runtime.schedule.GPipe` unless
        given; :meth:`value_and_grad` runs GPipe's training schedule then).
      trainable: the keys of :attr:`params` to train (each stage's
        :mod:`onnx2jax.trainable` rule, or :meth:`with_trainable`'s names).
    """

    def __init__(
        self,
        stages: Sequence[Stage],
        partition: Partition,
        model: PipelineModel,
        microbatches: int,
        configuration: str,
        structural: Sequence[Diagnostic] = (),
        schedule: "Schedule | PipelineSchedule | str | None" = None,
    ):
        static = [f"{i.name!r} {list(i.shape)}" for i in model.inputs if i.shape and isinstance(i.shape[0], int) and i.shape[0] > 0]
        if microbatches > 1 and static:
            raise ValueError(
                f"microbatches={microbatches} cuts axis 0 of every input, but the model declares a fixed axis 0 "
                f"on {', '.join(static)}: export it with a dynamic batch axis, or use microbatches=1"
            )
        self.stages = list(stages)
        self.partition = partition
        self.model = model
        self.input_names = model.input_names
        self.output_names = list(model.output_names)
        self.microbatches = microbatches
        self.configuration = configuration
        if isinstance(schedule, str) and schedule not in NAMES:
            raise ScheduleError(f"unknown schedule {schedule!r}: one of {', '.join(NAMES)}, or a PipelineSchedule")
        self.schedule: "Schedule | PipelineSchedule | str" = schedule if schedule is not None else GPipe()
        self._trainable: tuple[str, ...] | None = None
        #: per set of trained names, each stage's forward/backward programs (pipeline_train.StagePrograms)
        self.stage_programs: dict[tuple[str, ...], list] = {}
        self.uses_64bit = any(s.compiled.model.uses_64bit for s in self.stages)
        self._last_inputs: tuple | None = None
        self.stage_args: dict[int, dict[str, Any]] = {}  # the last call's inputs of each stage, by index
        self._reports: dict[tuple, PipelineReport] = {}  # report() per input shapes, repeats, micro-batches
        # sizes written on symbolic axes, checked at the shapes the graph runs at (a micro-batch's)
        self._sizes = SizesAtCall(model.proto, structural)

    @property
    def params(self) -> dict[str, jax.Array]:
        return merged_params(stage.compiled for stage in self.stages)

    # -- training ---------------------------------------------------------

    @property
    def trainable(self) -> tuple[str, ...]:
        """The keys of :attr:`params` to train: every stage's ``Compiled.trainable``, or :meth:`with_trainable`'s names."""
        if self._trainable is None:
            own = {k for stage in self.stages for k in stage.compiled.trainable}
            self._trainable = tuple(k for k in self.params if k in own)
        return self._trainable

    def with_trainable(self, names: Iterable[str]) -> "PipelineCompiled":
        """This pipeline (stages, programs and parameters shared) with ``names`` as :attr:`trainable`.

        Raises:
          ParameterError (a KeyError): a name is not a key of :attr:`params`, naming it.
        """
        other = copy.copy(self)
        other._trainable = checked_names(names, self.params, "with_trainable")
        chosen = set(other._trainable)
        other.stages = [
            dataclasses.replace(s, compiled=s.compiled.with_trainable([k for k in s.compiled.params if k in chosen]))
            for s in self.stages
        ]
        return other

    def to_onnx(
        self, params: Mapping[str, Any] | None = None, path: str | os.PathLike | None = None, *,
        external_data: bool | None = None,
    ) -> onnx.ModelProto:
        """The whole model (stage annotations kept) with ``params`` (some or all, laid out as :attr:`params`).

        See :func:`onnx2jax.runtime.training.write_onnx` for ``external_data``.
        """
        parts = [stage.compiled for stage in self.stages]
        return parts_to_onnx(self.model.proto, parts, self.params if params is None else params, path, external_data)

    def stage_ranks(self) -> tuple[int, ...]:
        """Each stage's rank: the index of its device group among the distinct groups, in stage order."""
        groups: list[tuple[int, ...]] = []
        for stage in self.stages:
            if tuple(stage.devices) not in groups:
                groups.append(tuple(stage.devices))
        return tuple(groups.index(tuple(stage.devices)) for stage in self.stages)

    def training_schedule(self, microbatches: int | None = None) -> PipelineSchedule:
        """The checked training schedule a gradient call runs (:mod:`onnx2jax.runtime.pipeline_schedules`).

        Raises:
          ScheduleError: a given schedule made for other stages or micro-batches,
            or a forward-only order (it says nothing of backwards).
        """
        m = self.microbatches if microbatches is None else microbatches
        schedule = self.schedule
        if isinstance(schedule, PipelineSchedule):
            if (schedule.stages, schedule.microbatches, schedule.stage_rank) != (len(self.stages), m, self.stage_ranks()):
                raise ScheduleError(
                    f"schedule {schedule.name!r} is for {schedule.stages} stages on ranks {list(schedule.stage_rank)} x "
                    f"{schedule.microbatches} micro-batches; this pipeline has {len(self.stages)} stages on ranks "
                    f"{list(self.stage_ranks())} x {m} micro-batches"
                )
            return schedule
        if isinstance(schedule, GPipe):
            schedule = "gpipe"
        if not isinstance(schedule, str):
            raise ScheduleError(
                f"schedule {schedule!r} orders forwards only: a gradient needs a PipelineSchedule or one of {', '.join(NAMES)}"
            )
        return build(schedule, self.stage_ranks(), m)

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> PipelineGrad:
        """``(params, *inputs, loss_args=(), **named) -> (loss, grads)`` through the stages, by the schedule.

        ``params``: the parameters to differentiate (for example
        ``{k: compiled.params[k] for k in compiled.trainable}``); the others
        are the pipeline's own. Each micro-batch's loss is
        ``loss_fn(outputs, *loss_args_slices)``; the loss returned is their sum
        (so a loss that sums over the batch equals the single program's), and
        ``grads`` its gradient, each placed like its parameter; a name that is
        not a parameter is a ``ParameterError``. See :mod:`onnx2jax.runtime.pipeline_train`.
        """
        return PipelineGrad(self, loss_fn)

    # -- running ----------------------------------------------------------

    def _bind(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> dict[str, Any]:
        return bind_inputs(self.model.inputs, inputs, named)

    def _split(self, bound: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The inputs cut into ``microbatches`` equal slices along axis 0."""
        m = self.microbatches
        if m == 1:
            return [dict(bound)]
        slices: list[dict[str, Any]] = [{} for _ in range(m)]
        for name, value in bound.items():
            value = value if isinstance(value, jax.Array) else np.asarray(value)
            if value.ndim == 0 or value.shape[0] % m:
                raise ValueError(
                    f"input {name!r} {list(np.shape(value))}: its axis 0 (the batch) must divide into "
                    f"microbatches={m} equal parts"
                )
            size = value.shape[0] // m
            for i in range(m):
                slices[i][name] = value[i * size : (i + 1) * size]
        return slices

    def _stage_inputs(self, stage: Stage, env: Mapping[str, Any]) -> dict[str, Any]:
        return {
            name: jax.device_put(env[name], holdable_sharding(tuple(np.shape(env[name])), stage.input_shardings[name]))
            for name in stage.inputs
        }

    def _run(self, inputs: Sequence[Any], named: Mapping[str, Any], params: Mapping[str, Any] | None) -> tuple:
        """Runs the schedule's steps; each stage its program (``params`` None) or its ``apply`` over ``params``."""
        envs = self._split(self._bind(inputs, named))
        self._sizes.check({name: tuple(np.shape(value)) for name, value in envs[0].items()})
        order = self.training_schedule(len(envs)) if isinstance(self.schedule, str) else self.schedule
        steps = list(order.steps(len(self.stages), len(envs)))
        check_order(steps, len(self.stages), len(envs))
        for k, m in steps:
            stage = self.stages[k]
            args = self._stage_inputs(stage, envs[m])
            if params is None:
                outputs = stage.compiled(**args)
            else:
                outputs = stage.compiled.apply(part_params(stage.compiled, params), **args)
            envs[m].update(zip(stage.outputs, outputs))
            if m == 0:
                self.stage_args[k] = args
        if len(envs) == 1:
            return tuple(envs[0][name] for name in self.output_names)
        return tuple(jnp.concatenate([env[name] for env in envs], axis=0) for name in self.output_names)

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the pipeline; returns jax.Arrays in ONNX output order, micro-batches joined on axis 0.

        Raises:
          sharding.ShardingError: a size written on a symbolic axis that a
            micro-batch's shapes contradict (naming the node, tensor and axis).
        """
        with x64_scope(self.uses_64bit):
            self._last_inputs = (inputs, named)
            self.model.index_check.call(inputs, named)  # onnx2jax.input_checks
            return self._run(inputs, named, None)

    def apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The pipeline as a function of ``params`` (laid out as :attr:`params`), stage by stage.

        Each stage runs its program's :meth:`~onnx2jax.runtime.spmd.Compiled.apply`
        on its own sub-mesh, in the schedule's order, each parameter moved onto
        its stage's devices. JAX has no program spanning several meshes, so this
        is not one jittable function: call it eagerly (``jax.grad`` through it
        works: ``device_put`` and each stage's constraints are differentiable).
        A model with 64-bit tensors needs ``jax.enable_x64`` around it.

        Raises:
          PipelineJitError: traced by ``jax.jit`` (or ``vmap``): the stages'
            parameters live on disjoint device sets.
        """
        for leaf in jax.tree.leaves((dict(params), inputs, named)):
            if isinstance(leaf, jax.core.Tracer) and not _concrete(leaf):
                raise PipelineJitError(
                    "a pipeline's apply cannot run under jax.jit (its stages hold parameters on disjoint device sets): "
                    "call it eagerly, or take gradients with compiled.value_and_grad(loss_fn)"
                )
        return self._run(inputs, named, params)

    def lower(self, *inputs: Any, **named: Any) -> list[jax.stages.Lowered]:
        """Each stage's lowered program at one micro-batch of these inputs, in run order.

        Runs nothing: what each stage receives is known from the earlier
        stages' output shapes (``jax.eval_shape``).
        """
        with x64_scope(self.uses_64bit):
            self.model.index_check.call(inputs, named)
            first = self._split(self._bind(inputs, named))[0]
            env: dict[str, Any] = {name: jax.ShapeDtypeStruct(np.shape(v), jnp.result_type(v)) for name, v in first.items()}
            lowered = []
            for stage in self.stages:
                args = {
                    name: jax.ShapeDtypeStruct(
                        env[name].shape, env[name].dtype,
                        sharding=holdable_sharding(tuple(env[name].shape), stage.input_shardings[name]),
                    )
                    for name in stage.inputs
                }
                lowered.append(stage.compiled.lower(**args))
                shapes = jax.eval_shape(  # abstract parameters: nothing placed (a target's stages too)
                    lambda p, a, c=stage.compiled: c.apply(p, **a), stage.compiled.abstract_params, args)
                env.update(zip(stage.outputs, shapes))
            return lowered

    # -- report -----------------------------------------------------------

    def report(self, *inputs: Any, repeats: int = 5, refresh: bool = False, **named: Any) -> "PipelineReport":
        """Per stage: nodes, devices, parameter bytes, bytes sent, collectives, time; and the bubble.

        Times the whole pipelined call and each stage alone on one
        micro-batch, alternately, best of ``repeats`` after a warm-up; the
        bubble fraction is
        ``1 - sum(M * stage time) / (S * pipeline time)``, to compare with the
        fill-drain bound ``(S-1)/(M+S-1)``. Uses the given inputs, else those
        of the last call.

        A report measured at these input shapes with as many ``repeats`` is kept
        and given again without running anything (timing a real-size pipeline
        takes tens of seconds); ``refresh=True`` measures again.

        Raises:
          ValueError: no inputs given and the model was never called.
        """
        inputs, named = example_inputs(inputs, named, self._last_inputs)
        key = (
            tuple(np.shape(v) for v in inputs),
            tuple(sorted((k, np.shape(v)) for k, v in named.items())),
            repeats,
            self.microbatches,
        )
        if not refresh and key in self._reports:
            return self._reports[key]
        self._reports[key] = report = measure(self, inputs, named, repeats)
        return report



def _concrete(leaf: jax.core.Tracer) -> bool:
    """Whether a tracer holds a value (eager ``jax.grad``), not an abstract one (``jit``, ``vmap``)."""
    from jax.extend.core import concrete_or_error  # jax.extend loads Pallas: only when a tracer comes

    try:
        concrete_or_error(None, leaf)
    except jax.errors.ConcretizationTypeError:
        return False
    return True


def compile_pipeline(plan: Plan, schedule: "Schedule | PipelineSchedule | str | None" = None) -> PipelineCompiled:
    """Compiles each stage of a staged model on its devices (see the module docstring), and runs them by
    ``schedule``.

    The stages are made by :func:`onnx2jax.runtime.pipeline_stages.compile_stages`. Sizes written
    on symbolic axes (the plan's ``structural`` notes) are checked at each call against a micro-batch's
    shapes.

    Raises:
      ValueError: ``microbatches`` < 1, or as :func:`~onnx2jax.runtime.pipeline_stages.compile_stages`.
      DeviceCountError, NodeError: as :func:`~onnx2jax.runtime.pipeline_stages.compile_stages`.
    """
    configuration, microbatches = plan.configuration, plan.microbatches
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches must be an int >= 1, got {microbatches!r}")
    stages, part, model = compile_stages(plan)
    return PipelineCompiled(stages, part, model, microbatches, configuration, plan.structural, schedule)


__all__ = ["PipelineCompiled", "compile_pipeline"]
