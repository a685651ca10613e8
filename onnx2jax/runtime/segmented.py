"""Sharded execution of a segmented model: one SPMD program per jitted segment, host steps between.

A model whose output shapes depend on run-time values is cut into jitted
segments and host steps (:mod:`sharding.segments`). ``onnx2jax.compile``
runs it as follows (the rules are in :mod:`sharding.segment_sharding`):

1. every jitted segment is annotated (its own nodes' specs, and the
   producer's spec on tensors it receives from an earlier jitted segment)
   and inferred; the layouts of all segments together choose **one mesh**
   (or the caller's), so every segment runs on the same devices and axes;
2. each jitted segment runs as one SPMD program
   (:class:`onnx2jax.runtime.spmd.Compiled`) over the sub-model the model was
   translated into once (``JaxModel.segment_models``) and the plan of its
   annotated model (:func:`onnx2jax.runtime.plan.program_plan`, taking the
   inference of step 1): inference at each call's shapes, NamedShardings,
   output shardings decided by us, one program per shape signature (a host
   step's output length changes the next segment's signature);
3. a call runs the steps in order. A host step **gathers** its inputs:
   ``np.asarray`` of each global ``jax.Array`` (every shard copied to the
   host, as if fully replicated), then numpy. The next jitted segment
   **re-places** the host's outputs with the spec of their first reader
   there (``Compiled.place_inputs``: the placement any graph input gets,
   replicated when JAX cannot hold the spec evenly, ``holdable_sharding``).
   A tensor one jitted segment hands to a later one stays where it is.

Nothing moves silently: :meth:`SegmentedCompiled.report` lists every gather
and re-place of the last call with its tensor, shape, bytes and sharding.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import numpy as np
import onnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from onnx2jax.errors import NodeError, NotDifferentiableError
from onnx2jax.runtime.executable import merged_params, part_params
from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.placements import mesh_for, spec_layouts
from onnx2jax.runtime.plan import Plan, program_plan
from onnx2jax.runtime.report import Report
from onnx2jax.runtime.spmd import Compiled
from onnx2jax.runtime.training import parts_to_onnx
from onnx2jax.trainable import checked_names
from onnx2jax.translate import JaxModel
from sharding.diagnostics import ShardingError
from sharding.segment_sharding import ShardedSegments, ignored_specs, ignored_text, shard_segments
from sharding.segments import Segment
from sharding.model_configs import device_configurations


@dataclasses.dataclass(frozen=True)
class Move:
    """One tensor moved between the host and the mesh during a call.

    Attributes:
      tensor: its name.
      step: the segment it moves into (1-based, as the report numbers them);
        for a graph output, the segment that produced it.
      kind: ``"gather"`` (to a host step), ``"re-place"`` (a host step's
        output onto the mesh for a jitted segment), ``"as placed"`` (a
        jitted segment's output read by a later one, where it already is:
        no transfer), ``"output"`` (a graph output no jitted segment
        returned: a host step's output, a graph input or an initializer).
      shape: its shape.
      dtype: its dtype name.
      nbytes: its bytes (the whole array: a gather copies every shard once).
      sharding: where it was (a gather) or went (a re-place, an output):
        the PartitionSpec text, ``"host"`` for a numpy array.
      source: the producing segment (1-based), or 0 for a graph input.
      reader: for a re-place, the first node of the segment that reads it
        with a spec (whose spec places it), or None (none has one: replicated).
    """

    tensor: str
    step: int
    kind: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    sharding: str
    source: int
    reader: str | None = None


class SegmentedCompiled:
    """A segmented model compiled for a mesh. Call it like the model; see :mod:`onnx2jax.runtime.segmented`.

    Attributes:
      model: the whole translated model (:class:`~onnx2jax.translate.JaxModel`).
      mesh: the one jax Mesh every segment runs on.
      configuration: the device configuration used (None: unannotated, replicated).
      segments: the steps in run order (``model.segments``).
      programs: per segment, its :class:`~onnx2jax.runtime.spmd.Compiled` (None for a host step).
      sharded: each segment's annotated model and inference, and what crosses
        (None for an unannotated model).
    """

    def __init__(
        self,
        model: JaxModel,
        mesh: Mesh,
        configuration: str | None,
        programs: Sequence[Compiled | None],
        sharded: ShardedSegments | None,
    ):
        self.model = model
        self.mesh = mesh
        self.configuration = configuration
        self.segments: list[Segment] = list(model.segments)
        self.programs = list(programs)
        self.sharded = sharded
        self.input_names = model.input_names
        self.output_names = list(model.output_names)
        self._producer = {}
        for index, segment in enumerate(self.segments):
            for name in segment.outputs:
                self._producer.setdefault(name, index + 1)
        crossings = sharded.crossings if sharded is not None else []
        self._readers = {(c.tensor, c.into + 1): c for c in crossings if c.reader is not None}
        self._last_args: tuple | None = None
        # The last call's inputs of each jitted segment, as placed (by segment index).
        self.segment_inputs: dict[int, dict[str, Any]] = {}
        self.moves: list[Move] = []  # the last call's gathers, re-places and host outputs
        self.last_outputs: list[tuple] = []  # the last call's outputs of each segment (in ``segment.outputs`` order)

    @property
    def params(self) -> dict[str, jax.Array]:
        """Every jitted segment's parameters, placed (a parameter two segments read: the first's copy)."""
        return merged_params(self.programs)

    # -- training ---------------------------------------------------------

    @property
    def trainable(self) -> tuple[str, ...]:
        """The keys of :attr:`params` to train: every segment's ``Compiled.trainable``, or :meth:`with_trainable`'s."""
        own = {k for program in self.programs if program is not None for k in program.trainable}
        return tuple(k for k in self.params if k in own)

    def with_trainable(self, names: Iterable[str]) -> "SegmentedCompiled":
        """This run (programs and parameters shared) with ``names`` as :attr:`trainable`.

        Raises:
          ParameterError (a KeyError): a name is not a key of :attr:`params`, naming it.
        """
        chosen = set(checked_names(names, self.params, "with_trainable"))
        other = copy.copy(self)
        other.programs = [
            None if p is None else p.with_trainable([k for k in p.params if k in chosen]) for p in self.programs
        ]
        return other

    def to_onnx(
        self, params: Mapping[str, Any] | None = None, path: str | os.PathLike | None = None, *,
        external_data: bool | None = None,
    ) -> onnx.ModelProto:
        """The whole model (annotations kept) with ``params`` (some or all, laid out as :attr:`params`) written in."""
        return parts_to_onnx(self.model.proto, self.programs, self.params if params is None else params, path, external_data)

    # -- running ----------------------------------------------------------

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the segments in turn; returns jax.Arrays on the mesh, in ONNX output order."""
        self._last_args = (inputs, named)
        self.model.index_check.call(inputs, named)  # onnx2jax.input_checks
        return self._run(inputs, named, None)

    def apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The segmented run as a function of ``params`` (laid out as :attr:`params`), segment by segment.

        Each jitted segment runs its program's
        :meth:`~onnx2jax.runtime.spmd.Compiled.apply`; the host steps between
        them need concrete values, so this is neither one jittable function
        nor differentiable across a host step: call it eagerly.
        """
        return self._run(inputs, named, params)

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple]:
        """Refused (the :class:`~onnx2jax.runtime.executable.Executable` protocol says which runs offer it).

        Raises:
          NotDifferentiableError: always, naming the first host step: no gradient flows through numpy.
        """
        host = next(s for s in self.segments if s.kind == "host")
        raise NotDifferentiableError(
            f"value_and_grad: node {host.nodes[0]!r} ({host.op_type}) runs on the host between the jitted segments "
            f"({host.reason}), and no gradient flows through it; {len(self.segments)} segments in all. Each jitted "
            "segment's program (programs[i]) offers value_and_grad over its own parameters"
        )

    def _run(self, inputs: Sequence[Any], named: Mapping[str, Any], params: Mapping[str, Any] | None) -> tuple:
        bound = self.model.bind_inputs(inputs, named)
        moves: list[Move] = []
        self.last_outputs = []
        with x64_scope(self.model.uses_64bit):
            # Initializers too: a graph output may be one (each segment reads its own copies).
            env: dict[str, Any] = {**self.model.constants, **self.model.params, **bound}
            for index, (segment, program) in enumerate(zip(self.segments, self.programs)):
                values = {name: env[name] for name in segment.inputs}
                if program is None:
                    outputs = self._host_step(index, values, moves)
                else:
                    placed = program.place_inputs(**values)
                    for name in segment.inputs:
                        source = self._producer.get(name)
                        if source is not None:
                            kind = "re-place" if self.segments[source - 1].kind == "host" else "as placed"
                            moves.append(self._move(name, index + 1, kind, placed[name]))
                    self.segment_inputs[index] = placed
                    if params is None:
                        outputs = program(**placed)
                    else:
                        outputs = program.apply(part_params(program, params), **placed)
                self.last_outputs.append(tuple(outputs))
                env.update(zip(segment.outputs, outputs))
            results = tuple(self._output(name, env[name], moves) for name in self.output_names)
        self.moves = moves
        return results

    def _host_step(self, index: int, values: Mapping[str, Any], moves: list[Move]) -> list:
        """Gathers a host step's inputs (the global arrays as numpy) and runs its node there."""
        for name, value in values.items():
            moves.append(self._move(name, index + 1, "gather", value))
        gathered = {name: _to_host(value) for name, value in values.items()}
        return self.model.segment_runner(index)(gathered)

    def _output(self, name: str, value: Any, moves: list[Move]) -> jax.Array:
        """A graph output as a jax.Array on the mesh; one a host step produced goes replicated (reported)."""
        if isinstance(value, jax.Array) and value.sharding.device_set == set(self.mesh.devices.flat):
            return value
        placed = jax.device_put(np.asarray(value), NamedSharding(self.mesh, PartitionSpec()))
        moves.append(self._move(name, self._producer.get(name, 0), "output", placed))
        return placed

    def _move(self, name: str, step: int, kind: str, value: Any) -> Move:
        sharding = getattr(value, "sharding", None)
        where = str(sharding.spec) if isinstance(sharding, NamedSharding) else "host"
        crossing = self._readers.get((name, step)) if kind == "re-place" else None
        reader = crossing.reader if crossing is not None else None
        if crossing is not None and crossing.spec.sharded_dims and sharding.is_fully_replicated:
            where += ", replicated: its reader's spec does not divide the shape (cut inside the program)"
        shape = tuple(int(d) for d in np.shape(value))
        dtype = np.dtype(value.dtype)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        return Move(name, step, kind, shape, dtype.name, nbytes, where, self._producer.get(name, 0), reader)

    def lower(self, *inputs: Any, **named: Any) -> list[jax.stages.Lowered | None]:
        """Per segment, its lowered program at these inputs (None: a host step). Runs the model once on them."""
        self(*inputs, **named)
        with x64_scope(self.model.uses_64bit):
            return [
                None if program is None else program.lower(**self.segment_inputs[index])
                for index, program in enumerate(self.programs)
            ]

    def compiled_text(self, *inputs: Any, **named: Any) -> str:
        """Refused: a segmented model is several programs (see :meth:`compiled_texts`)."""
        self._refuse_one_program()

    def _refuse_one_program(self) -> None:
        host = next(s for s in self.segments if s.kind == "host")
        raise NodeError(
            f"node {host.nodes[0]!r}: {host.reason}. The model runs as {len(self.segments)} segments, "
            "not one program: compiled_texts(...) gives each jitted segment's HLO"
        )

    def compiled_texts(self, *inputs: Any, **named: Any) -> list[str | None]:
        """Per segment, the HLO text of its compiled, partitioned program at these inputs (None: a host step)."""
        self(*inputs, **named)
        return [
            None if program is None else program.compiled_text(**self.segment_inputs[index])
            for index, program in enumerate(self.programs)
        ]

    # -- report -----------------------------------------------------------

    def report(self, *inputs: Any, **named: Any) -> "SegmentedReport":
        """Per segment: the jitted segments' reports, the host steps and why each is cut, every move.

        Runs the model on the given inputs, else those of the last call.

        Raises:
          ValueError: no inputs given and the model was never called.
        """
        if not inputs and not named:
            if self._last_args is None:
                raise ValueError("report() needs example inputs, or call the model once first")
            inputs, named = self._last_args
        self(*inputs, **named)
        steps = []
        for index, (segment, program) in enumerate(zip(self.segments, self.programs)):
            report = None if program is None else program.report(**self.segment_inputs[index])
            steps.append(StepReport(index + 1, segment, report))
        ignored = {}
        if self.sharded is not None:
            ignored = {
                index + 1: ignored_specs(self.sharded, index, self.configuration)
                for index, program in enumerate(self.programs)
                if program is None
            }
        return SegmentedReport(dict(self.mesh.shape), self.configuration, steps, list(self.moves), ignored)


@dataclasses.dataclass
class StepReport:
    """One segment of :class:`SegmentedReport`: a jitted program (with its Report) or a host step."""

    step: int
    segment: Segment
    report: Report | None

    @property
    def collectives(self) -> dict[str, int]:
        """Collectives of the segment's compiled HLO (none for a host step)."""
        return self.report.collectives if self.report is not None else {}


@dataclasses.dataclass
class SegmentedReport:
    """What :meth:`SegmentedCompiled.report` found: each step, and every tensor moved to or from the host."""

    mesh: dict[str, int]
    configuration: str | None
    steps: list[StepReport]
    moves: list[Move]
    ignored: dict[int, list[str]] = dataclasses.field(default_factory=dict)  # per host step: specs that do not apply

    @property
    def collectives(self) -> dict[str, int]:
        """Collectives of every jitted segment's compiled HLO, added up by kind."""
        total: dict[str, int] = {}
        for step in self.steps:
            for kind, count in step.collectives.items():
                total[kind] = total.get(kind, 0) + count
        return total

    def lines(self) -> list[str]:
        """The segments, why each host step is cut, and the moves, as plain text lines."""
        lines = [
            f"segmented run: {len(self.steps)} segments on mesh {self.mesh}, configuration {self.configuration!r} "
            "(output shapes that depend on run-time values: each host step gathers its inputs from the "
            "devices, and the next jitted segment re-places its outputs)"
        ]
        for step in self.steps:
            segment = step.segment
            if step.report is None:
                variable = ", ".join(map(repr, segment.variable))
                lines.append(
                    f"segment {step.step}: host step {segment.nodes[0]!r} ({segment.op_type}): "
                    f"output {variable} has a data-dependent length. {segment.reason}"
                )
                lines += ignored_text(self.ignored.get(step.step, []))
            else:
                collectives = ", ".join(f"{k} {v}" for k, v in step.report.collectives.items() if v) or "none"
                per_device = sorted(step.report.param_bytes_per_device.values()) or [0]
                lines.append(
                    f"segment {step.step}: jitted program, {len(segment.nodes)} node(s); collectives: {collectives}; "
                    f"parameter bytes per device {per_device[-1]:,} (max) / {per_device[0]:,} (min)"
                )
            for move in self.moves:
                if move.step == step.step and move.kind != "output":
                    lines.append("  " + _move_text(move))
        for move in self.moves:
            if move.kind == "output":
                lines.append(_move_text(move))
        return lines

    def render(self, console=None, *, every_spec: bool = False) -> None:
        """Prints each jitted segment's report (specs, collectives, bytes), then the segments and moves."""
        from rich.console import Console

        console = console or Console()
        for step in self.steps:
            if step.report is not None:
                console.print(f"[bold]segment {step.step}[/bold] (jitted)")
                step.report.render(console, every_spec=every_spec)
        for line in self.lines():
            console.print(line, markup=False)


def _to_host(value: Any) -> np.ndarray:
    """The global value as numpy on this host: every shard copied once.

    An array spanning several processes (hosts) is gathered to every process
    (``process_allgather``); each then runs the host step on the same value.
    """
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(value, tiled=True))
    return np.asarray(value)


def _move_text(move: Move) -> str:
    what = f"{move.tensor!r} {list(move.shape)} {move.dtype} ({move.nbytes:,} bytes)"
    source = "graph input" if move.source == 0 else f"segment {move.source}"
    if move.kind == "gather" and move.sharding == "host":
        return f"gather {what} from {source}: already a host array, nothing moves"
    if move.kind == "gather":
        return f"gather {what} from {source} ({move.sharding}) to the host: np.asarray of the global array"
    if move.kind == "re-place":
        reader = f"the spec of its first reader {move.reader!r}" if move.reader else "no reader has a spec: replicated"
        return f"re-place {what} from host step {move.source} onto the mesh as {move.sharding} ({reader})"
    if move.kind == "as placed":
        return f"receive {what} from segment {move.source} as placed, {move.sharding}: no transfer"
    source = f"host step {move.source}" if move.source else "a graph input or initializer"
    return f"output {what} from {source}: returned replicated on the mesh ({move.sharding})"


def compile_segmented(plan: Plan) -> SegmentedCompiled:
    """Compiles each jitted segment of the planned model on one mesh (see the module docstring).

    The model is translated once; each jitted segment's program runs the
    sub-model that translation made, and each segment is inferred once (with
    its neighbours, :func:`sharding.segment_sharding.shard_segments`).

    Raises:
      sharding.ShardingError: a segment's annotations have errors (each names
        its node, tensor and axis).
      onnx2jax.errors.MeshMappingError: the segments' specs fit no single mesh.
    """
    model = JaxModel(
        plan.proto, plan.external_dir, scan_layers=plan.scan_layers, inferred=plan.inferred, precision=plan.precision,
        compute_dtype=plan.compute_dtype,
    )
    segments = model.segment_plan
    configuration, mesh = plan.configuration, plan.mesh
    if configuration is None:
        mesh = mesh or Mesh(np.array(jax.devices()[:1]), ("d0",))
        programs = [
            None if sub is None else Compiled(sub, program_plan(sub.proto, None, mesh)) for sub in model.segment_models
        ]
        return SegmentedCompiled(model, mesh, None, programs, None)
    num_devices = device_configurations(model.proto)[configuration].num_devices
    sharded = shard_segments(segments, configuration)
    errors = [d for inference in sharded.inferences if inference is not None for d in inference.errors()]
    if plan.check and errors:
        raise ShardingError(errors)
    devices = plan.devices
    if mesh is None:
        layouts = {}
        for inference in sharded.inferences:
            if inference is not None:
                layouts.update(spec_layouts(inference, strict=False))
        mesh, mapping = mesh_for(layouts, configuration, num_devices, None, None, None)
        positions = [0] * num_devices
        for position, config_device in enumerate(mapping.plan.device_order):
            positions[config_device] = position
        devices = tuple(positions)
    programs = [
        None
        if annotated is None
        else Compiled(
            sub,
            program_plan(
                annotated, configuration, mesh, check=plan.check, devices=devices, structural=plan.structural,
                inference=inference,
            ),
        )
        for sub, annotated, inference in zip(model.segment_models, sharded.models, sharded.inferences)
    ]
    return SegmentedCompiled(model, mesh, configuration, programs, sharded)


__all__ = ["Move", "SegmentedCompiled", "SegmentedReport", "StepReport", "compile_segmented"]
