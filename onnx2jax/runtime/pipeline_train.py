"""Gradients through pipeline stages: each stage a forward and a backward program, run by a schedule.

JAX has no program across meshes, so ``jax.grad`` cannot take a pipeline
whole. Here each stage gets its own jitted programs on its sub-mesh
(:class:`StagePrograms`), TP inside the stage as its ``Compiled`` has it:

- **forward**: ``jax.vjp`` of the stage's ``apply`` over (the trained
  parameters, the activations it receives), returning its outputs and the
  VJP closure: a pytree whose leaves are the residuals backward needs,
  which stay on the stage's devices until its backward;
- **backward** ``B``: the closure applied to the outputs' cotangents: weight
  and input gradients; or, where the schedule splits it (ZeroBubble),
  **input gradient** ``I`` and **weight gradient** ``W`` as two programs
  over the same residuals (each compiles only its half);
- the **loss**: ``jax.value_and_grad`` of the user's loss over a
  micro-batch's outputs, on the devices of the last stage that produces one.

:func:`value_and_grad` runs a :class:`~onnx2jax.runtime.pipeline_schedules.PipelineSchedule`'s
actions in its checked issue order: ``SEND_F`` puts a stage's outputs where
their consumers read them, ``SEND_B`` puts input gradients where their
producers hold those activations (``RECV_*`` only mark where a rank waits:
a single controller's ``device_put`` already lands on the receiver), and
sums each stage's weight gradients over the micro-batches. Nothing blocks:
JAX's asynchronous dispatch overlaps stages on different devices.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.parameters import holdable_sharding
from onnx2jax.runtime.pipeline_schedules import PipelineSchedule, issue_order
from onnx2jax.trainable import checked_names

if TYPE_CHECKING:
    from onnx2jax.runtime.pipeline import PipelineCompiled
    from onnx2jax.runtime.pipeline_stages import Stage

#: The loss's cotangent seed per micro-batch: the losses are summed.
LossFn = Callable[..., Any]


def _floating(value: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(value), jnp.inexact)


class StagePrograms:
    """One stage's jitted forward, backward, input- and weight-gradient programs (each traced once per shape).

    ``trained`` names the parameters gradients are taken for; the stage's
    other parameters are passed as they are placed.
    """

    def __init__(self, stage: "Stage", trained: Sequence[str], differentiable: Sequence[str]):
        self.stage = stage
        compiled = stage.compiled
        self.trained = tuple(k for k in trained if k in compiled.params)
        self.differentiable = tuple(differentiable)
        shardings = {k: compiled.params[k].sharding for k in self.trained}

        def forward(trained, frozen, received, other):
            def run(t, r):
                return compiled.apply({**frozen, **t}, **r, **other)

            return jax.vjp(run, trained, received)

        self.forward = jax.jit(forward)
        self.backward = jax.jit(lambda vjp, cts: vjp(cts), out_shardings=(shardings, None))
        self.input_grad = jax.jit(lambda vjp, cts: vjp(cts)[1])
        self.weight_grad = jax.jit(lambda vjp, cts: vjp(cts)[0], out_shardings=shardings)
        self.add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b), out_shardings=shardings)


@dataclasses.dataclass
class _MicroBatch:
    """What one micro-batch has in flight: activations, residuals, cotangents."""

    values: dict[str, Any]  # graph inputs and every stage output, by tensor name
    inbox: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # per stage, its placed inputs
    vjp: dict[int, Any] = dataclasses.field(default_factory=dict)
    cotangents: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # per stage, per output
    input_grads: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)
    loss: Any = None


class PipelineGrad:
    """``(params, *inputs, loss_args=(), **named) -> (loss, grads)`` of a pipeline; see :func:`value_and_grad`."""

    def __init__(self, pipeline: "PipelineCompiled", loss_fn: LossFn):
        self.pipeline = pipeline
        self.loss_fn = loss_fn
        self._loss: dict[tuple, Any] = {}
        #: per stage, the most micro-batches whose residuals it held at once in the last call
        self.peak_held: list[int] = []
        #: per stage, the residual bytes of one micro-batch in the last call
        self.residual_bytes: list[int] = []

    def _stage_programs(self, trained: Sequence[str]) -> list[StagePrograms]:
        """The stages' programs for these trained names: kept on the pipeline, shared by every loss."""
        key = tuple(trained)
        cache = self.pipeline.stage_programs
        found = cache.get(key)
        if found is None:
            producers = {name for stage in self.pipeline.stages for name in stage.outputs}
            found = cache[key] = [
                StagePrograms(stage, trained, [n for n in stage.inputs if n in producers]) for stage in self.pipeline.stages
            ]
        return found

    def _loss_program(self, floating: tuple[bool, ...]):
        found = self._loss.get(floating)
        if found is None:
            loss_fn = self.loss_fn

            def loss(diff, rest, extra):
                it_d, it_r = iter(diff), iter(rest)
                outputs = tuple(next(it_d) if f else next(it_r) for f in floating)
                return loss_fn(outputs, *extra)

            found = self._loss[floating] = jax.jit(jax.value_and_grad(loss))
        return found

    def __call__(self, params: Mapping[str, Any], *inputs: Any, loss_args: Sequence[Any] = (), **named: Any):
        pipeline = self.pipeline
        checked_names(params, pipeline.params, "value_and_grad")
        with x64_scope(pipeline.uses_64bit):
            pipeline.model.index_check.call(inputs, named)
            bound = pipeline._bind(inputs, named)
            micro = pipeline._split(bound)
            extras = pipeline._split({str(i): a for i, a in enumerate(loss_args)}) if loss_args else [{}] * len(micro)
            pipeline._sizes.check({name: tuple(np.shape(value)) for name, value in micro[0].items()})
            schedule = pipeline.training_schedule(len(micro))
            return self._run(schedule, params, micro, extras)

    def _run(self, schedule: PipelineSchedule, params: Mapping[str, Any], micro, extras):
        pipeline = self.pipeline
        stages = pipeline.stages
        programs = self._stage_programs(sorted(params))
        placed = []  # per stage: (trained on its devices, its other parameters)
        for program in programs:
            own = program.stage.compiled.params
            trained = {k: jax.device_put(params[k], own[k].sharding) for k in program.trained}
            placed.append((trained, {k: v for k, v in own.items() if k not in trained}))
        batches = [_MicroBatch(dict(values)) for values in micro]
        consumers = {name: [k for k, s in enumerate(stages) if name in s.inputs] for s in stages for name in s.outputs}
        producer = {name: k for k, s in enumerate(stages) for name in s.outputs}
        grads: list[Any] = [None] * len(stages)
        held, peak = [0] * len(stages), [0] * len(stages)
        self.residual_bytes = [0] * len(stages)
        losses = []
        order = issue_order(schedule)
        sends_back = {(a.stage, a.microbatch) for a in order if a.kind == "SEND_B"}
        for action in order:
            k, m = action.stage, action.microbatch
            batch, program, stage = batches[m], programs[k], stages[k]
            if action.kind == "F":
                received = batch.inbox.pop(k, {})
                for name in stage.inputs:  # graph inputs, and activations of a stage on the same rank
                    if name not in received:
                        received[name] = self._place(stage, name, batch.values[name])
                diff = {n: received[n] for n in program.differentiable if _floating(received[n])}
                other = {n: v for n, v in received.items() if n not in diff}
                outputs, batch.vjp[k] = program.forward(placed[k][0], placed[k][1], diff, other)
                batch.values.update(zip(stage.outputs, outputs))
                held[k] += 1
                peak[k] = max(peak[k], held[k])
                if m == 0:
                    self.residual_bytes[k] = sum(x.nbytes for x in jax.tree.leaves(batch.vjp[k]))
            elif action.kind == "SEND_F":
                for name in stage.outputs:
                    for consumer in consumers[name]:
                        batch.inbox.setdefault(consumer, {})[name] = self._place(stages[consumer], name, batch.values[name])
            elif action.kind in ("B", "I"):
                if batch.loss is None:
                    self._loss_of(batch, extras[m], producer)
                    losses.append(batch.loss)
                cts = self._cotangents(batch, k, stage)
                if action.kind == "B":
                    weights, batch.input_grads[k] = program.backward(batch.vjp.pop(k), cts)
                    grads[k] = weights if grads[k] is None else program.add(grads[k], weights)
                    held[k] -= 1
                else:
                    batch.input_grads[k] = program.input_grad(batch.vjp[k], cts)
                    batch.cotangents[k] = cts
                if (k, m) not in sends_back:  # the producer is on this rank: its gradient is here already
                    self._route_back(batch, k, producer)
                for name in stage.outputs:  # read by its consumers and the loss already: only residuals stay
                    batch.values.pop(name, None)
            elif action.kind == "W":
                weights = program.weight_grad(batch.vjp.pop(k), batch.cotangents.pop(k))
                grads[k] = weights if grads[k] is None else program.add(grads[k], weights)
                held[k] -= 1
            elif action.kind == "SEND_B":
                self._route_back(batch, k, producer)
        self.peak_held = peak
        return sum(losses[1:], losses[0]), self._gather(params, programs, grads)

    @staticmethod
    def _place(stage: "Stage", name: str, value: Any) -> Any:
        return jax.device_put(value, holdable_sharding(tuple(np.shape(value)), stage.input_shardings[name]))

    def _loss_of(self, batch: _MicroBatch, extra: Mapping[str, Any], producer: Mapping[str, int]) -> None:
        """The micro-batch's loss and its outputs' cotangents, on the last producing stage's devices."""
        names = self.pipeline.output_names
        home = max(producer[n] for n in names)
        devices = self.pipeline.stages[home].compiled.mesh
        target = jax.sharding.NamedSharding(devices, jax.sharding.PartitionSpec())
        outputs = []
        for name in names:
            value = batch.values[name]
            outputs.append(value if producer[name] == home else jax.device_put(value, target))
        floating = tuple(_floating(o) for o in outputs)
        extra_values = tuple(jax.device_put(extra[str(i)], target) for i in range(len(extra)))
        loss, cts = self._loss_program(floating)(
            [o for o, f in zip(outputs, floating) if f], [o for o, f in zip(outputs, floating) if not f], extra_values
        )
        batch.loss = loss
        it = iter(cts)
        for name, f in zip(names, floating):
            if f:
                ct = next(it)
                k = producer[name]
                ct = ct if k == home else jax.device_put(ct, batch.values[name].sharding)
                batch.cotangents.setdefault(k, {})[name] = ct

    def _cotangents(self, batch: _MicroBatch, k: int, stage: "Stage") -> tuple:
        """Stage ``k``'s output cotangents in output order (zeros for an output no later use differentiates)."""
        given = batch.cotangents.pop(k, {})
        result = []
        for name in stage.outputs:
            value = batch.values[name]
            if name in given:
                result.append(given[name])
            elif _floating(value):
                result.append(jnp.zeros_like(value))
            else:
                result.append(np.zeros(np.shape(value), jax.dtypes.float0))
        return tuple(result)

    def _route_back(self, batch: _MicroBatch, k: int, producer: Mapping[str, int]) -> None:
        """Stage ``k``'s input gradients, each added to its producer's cotangent where that stage holds it."""
        for name, grad in batch.input_grads.pop(k, {}).items():
            j = producer[name]
            grad = jax.device_put(grad, batch.values[name].sharding)
            slot = batch.cotangents.setdefault(j, {})
            slot[name] = grad if name not in slot else slot[name] + grad

    def _gather(self, params: Mapping[str, Any], programs: Sequence[StagePrograms], grads: Sequence[Any]) -> dict:
        """Each parameter's gradient summed over the stages that read it, placed like ``params``'s."""
        result: dict[str, Any] = {}
        for program, stage_grads in zip(programs, grads):
            for name, grad in (stage_grads or {}).items():
                target = getattr(params[name], "sharding", None)
                if not isinstance(target, jax.sharding.Sharding):
                    target = self.pipeline.params[name].sharding
                grad = jax.device_put(grad, target)
                result[name] = grad if name not in result else result[name] + grad
        return result


def value_and_grad(pipeline: "PipelineCompiled", loss_fn: LossFn) -> PipelineGrad:
    """``(params, *inputs, loss_args=(), **named) -> (loss, grads)`` through ``pipeline``'s stages.

    ``params``: the parameters to differentiate (a subset of
    ``pipeline.params``, laid out alike); the others are the pipeline's own.
    The batch (axis 0 of every input and of each ``loss_args`` array) is cut
    into the pipeline's micro-batches; per micro-batch the loss is
    ``loss_fn(outputs, *loss_args)`` (outputs in ONNX order); the returned
    loss is their sum and ``grads`` its gradient, each placed like its
    parameter. A loss that sums over the batch thus equals the single
    program's.
    """
    return PipelineGrad(pipeline, loss_fn)


__all__ = ["PipelineGrad", "StagePrograms", "value_and_grad"]
