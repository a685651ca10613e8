"""`auto_plan`: the best layout for a model, a device count and a workload, found by search.

The search reads the model once (`sharding.auto.analysis.PlanAnalysis`), evaluates every candidate
(`sharding.auto.candidates`) as data against that one graph, predicts each one's step time and
memory per device (`sharding.auto.cost`), keeps those within the memory limit, and writes the
fastest into a copy of the model, once. Among equal times it prefers fewer collective bytes, then
fewer parameter bytes per device.

The memory limit is ``memory_per_device`` when given. When it is not, it is the memory per device
of the hand plan (`sharding.megatron.megatron_plan`, given the same batch), and a layout may hold no
more parameter bytes per device than the hand plan either, so that an automatic plan never holds more
per device than the hand plan: a user who gives no limit gets the hand
plan's footprint at the lowest predicted time; one who gives a limit lets the search trade
memory for time (data parallelism replicates the weights).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import onnx

from sharding.auto.analysis import KINDS, Evaluation, PlanAnalysis, write_plan
from sharding.auto.candidates import Candidate, candidates, hand_plan
from sharding.auto.cost import DEFAULT_RATES, OBJECTIVES, Cost, Rates, predict
from sharding.auto.errors import DeviceSplitError, MemoryLimitError, MeshShapeError
from sharding.auto.pipelines import Pipeline, pipelines
from sharding.auto.pipelines import evaluate as evaluate_pipeline
from sharding.model_arg import ModelArg, as_model_proto
from sharding.stage_cut import DEFAULT_SEQUENCE, declared_shapes

_log = logging.getLogger(__name__)

MESH_AXES = ("data", "tensor")


@dataclass(frozen=True)
class Row:
    """One candidate in the report: what inference predicts for it and what that costs."""

    name: str
    data: int
    tensor: int
    variant: str
    collectives: dict[str, int]
    collective_bytes: int
    param_bytes: int
    memory: int
    seconds: float
    communication: float
    compute: float
    fits: bool
    errors: tuple[str, ...] = ()
    pruned: bool = False
    pipeline: int = 1

    def line(self) -> str:
        """One line: name, collectives, bytes, memory and predicted time."""
        if self.pruned:
            return (f"{self.name}: {self.param_bytes:,} parameter bytes per device, over the limit: "
                    "pruned before inference")
        counts = ", ".join(f"{v} {k}" for k, v in self.collectives.items() if v) or "no collectives"
        state = "" if self.fits else ("  [invalid: " + self.errors[0] + "]" if self.errors else "  [over the memory limit]")
        return (f"{self.name}: {counts}; {self.collective_bytes:,} collective bytes, "
                f"{self.param_bytes:,} parameter bytes and {self.memory:,} bytes per device; "
                f"predicted {self.seconds * 1e6:,.1f} us ({self.communication * 1e6:,.1f} communication + "
                f"{self.compute * 1e6:,.1f} compute){state}")


@dataclass
class AutoReport:
    """What `auto_plan` weighed and chose, and (filled by the runtime once compiled) what was measured.

    Attributes:
        devices: The device count.
        objective: ``latency``, ``throughput`` or ``train``.
        batch, seq: The workload the shapes were bound to.
        memory_limit: Bytes per device a layout may hold; where the limit comes from in ``limit_source``.
        rates: The cost model's rates (their ``source`` says calibrated or defaults).
        rows: Every candidate evaluated, the valid ones within the limit first, fastest first.
        winner: The chosen row; ``hand``: the hand plan's row.
        search_seconds: Wall time of the search (analysis, evaluations, writing the winner).
        evaluation: The winner's `Evaluation` (its predicted collectives, node by node).
        notes: The winner's pattern notes (what it left whole and why).
        measured: Filled by `onnx2jax.runtime.auto_check`: the compiled winner's collectives by
            kind, their bytes and the parameter bytes per device.
        differences: Filled there too: each way the compiled program differs from the prediction.
        target: Filled by `onnx2jax.runtime.auto_target` for a plan against a TPU target: the best
            candidates as the TPU compiler ranks them (its ``lines()`` are appended to `lines`).
        writer: Writes an evaluated candidate (by row name) into a copy of the model, with its evaluation
            and notes (`annotated`, `choose`).
    """

    devices: int
    objective: str
    batch: int | None
    seq: int | None
    memory_limit: int
    limit_source: str
    rates: Rates
    rows: list[Row]
    winner: Row
    hand: Row
    search_seconds: float
    evaluation: Evaluation = field(repr=False)
    notes: tuple[str, ...] = ()
    measured: dict | None = None
    differences: list[str] = field(default_factory=list)
    target: object | None = None
    writer: Callable[[str], tuple[onnx.ModelProto, Evaluation, tuple[str, ...]]] | None = field(default=None, repr=False, compare=False)

    def annotated(self, name: str) -> onnx.ModelProto:
        """The candidate row ``name`` written into a copy of the model (configuration ``auto``), as the
        winner is: what a re-ranking against a target compiles for each of the best few.

        Raises:
            KeyError: no evaluated candidate of that name (a pruned one was never evaluated).
        """
        return self._written(name)[0]

    def choose(self, name: str) -> onnx.ModelProto:
        """Makes the evaluated candidate ``name`` the winner (a re-ranking's choice: `winner`, `evaluation` and
        `notes` become its own) and returns it written, as `annotated` does."""
        model, evaluation, notes = self._written(name)
        self.winner = next(row for row in self.rows if row.name == name)
        self.evaluation, self.notes = evaluation, notes
        return model

    def _written(self, name: str) -> tuple[onnx.ModelProto, Evaluation, tuple[str, ...]]:
        if self.writer is None:
            raise KeyError(f"this report keeps no candidates to write; {name!r} cannot be annotated")
        return self.writer(name)

    def lines(self, top: int = 5) -> list[str]:
        """The report as text: the winner, the top candidates, the hand plan, and the measured check."""
        out = [
            f"automatic plan on {self.devices} devices, objective {self.objective}, batch {self.batch or 1}, "
            f"sequence {self.seq or DEFAULT_SEQUENCE} (where symbolic): {self.winner.name} (searched {len(self.rows)} layouts in "
            f"{self.search_seconds:.2f} s)",
            f"memory limit {self.memory_limit:,} bytes per device ({self.limit_source}); rates: {self.rates.source}",
            "top candidates (predicted):",
        ]
        if self.objective == "train":
            out.insert(2, "train: the collectives listed (and measured) are the forward program's; the predicted "
                          "communication adds their backward mirror and, with a data degree, the gradients' all-reduce")
        out += [f"  {i + 1}. {row.line()}" for i, row in enumerate(self.rows[:top])]
        out.append(f"hand plan: {self.hand.line()}")
        if self.measured is not None:
            m = self.measured
            counts = ", ".join(f"{v} {k}" for k, v in m["collectives"].items() if v) or "no collectives"
            moved = "not measured" if m["collective_bytes"] is None else f"{m['collective_bytes']:,}"
            out.append(f"winner measured (compiled HLO): {counts}; {moved} collective bytes, "
                       f"{m['param_bytes']:,} parameter bytes per device"
                       + (f"; {m['seconds'] * 1e6:,.1f} us per call" if m.get("seconds") else ""))
            out += [f"difference: {d}" for d in self.differences] or ["measured = predicted (collectives, bytes, "
                                                                      "parameter bytes per device)"]
        if self.target is not None:
            out += self.target.lines()  # type: ignore[attr-defined]
        return out

    def as_dict(self, top: int = 5) -> dict:
        """What `lines` says, as data (``explain --auto --json``): the top rows, the hand plan's, the check."""
        return {
            "devices": self.devices, "objective": self.objective, "batch": self.batch, "seq": self.seq,
            "memory_limit": self.memory_limit, "limit_source": self.limit_source, "rates": self.rates.source,
            "searched": len(self.rows), "search_seconds": self.search_seconds, "winner": asdict(self.winner),
            "top": [asdict(row) for row in self.rows[:top]], "hand": asdict(self.hand),
            "notes": list(self.notes), "measured": self.measured, "differences": list(self.differences),
            **({} if self.target is None else {"target": self.target.as_dict()}),  # type: ignore[attr-defined]
        }


def _mesh(devices: int | Mapping[str, int] | Sequence[int]) -> tuple[int, tuple[int, int] | None]:
    """The device count and, for a mesh shape, its (data, tensor) degrees."""
    if isinstance(devices, bool):
        raise MeshShapeError(f"devices must be a count or a mesh shape, got {devices!r}")
    if isinstance(devices, int):
        if devices < 1:
            raise MeshShapeError(f"devices must be >= 1, got {devices}")
        return devices, None
    if isinstance(devices, Mapping):
        unknown = sorted(set(devices) - set(MESH_AXES))
        if unknown:
            raise MeshShapeError(f"mesh shape {dict(devices)}: no axis {unknown[0]!r}; the axes are {MESH_AXES} "
                                 "(pipelines are searched by themselves when no data x tensor layout fits)")
        shape = tuple(devices.get(axis, 1) for axis in MESH_AXES)
    else:
        shape = tuple(devices)
        if len(shape) != len(MESH_AXES):
            raise MeshShapeError(f"mesh shape {shape}: give (data, tensor), {len(MESH_AXES)} degrees")
    if any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
        raise MeshShapeError(f"mesh shape {shape}: every degree must be an int >= 1")
    return math.prod(shape), shape  # type: ignore[return-value]


def _row(candidate: Candidate, evaluation: Evaluation, cost: Cost, limit: int, param_limit: int | None) -> Row:
    valid = not evaluation.errors and (param_limit is None or cost.param_bytes <= param_limit)
    return Row(
        name=candidate.name, data=candidate.data, tensor=candidate.tensor, variant=candidate.variant,
        collectives=evaluation.counts(), collective_bytes=evaluation.collective_bytes,
        param_bytes=cost.param_bytes, memory=cost.memory, seconds=cost.seconds,
        communication=cost.communication, compute=cost.compute,
        fits=valid and cost.memory <= limit, errors=evaluation.errors,
    )


def _key(row: Row) -> tuple:
    return (row.pruned, not row.fits, row.seconds, row.collective_bytes, row.param_bytes)


def _evaluated(analysis, candidate, rates, objective, limit, param_limit, num_devices, rows, chosen) -> Row | None:
    """Evaluates ``candidate`` (inference over the one graph) into ``rows``; None when it cannot be lifted."""
    written = candidate.written
    if written is None:
        return None
    evaluation = analysis.evaluate(written, num_devices)
    row = _row(candidate, evaluation, predict(evaluation, rates, objective, candidate.data), limit, param_limit)
    rows.append(row)
    chosen[row.name] = (candidate, evaluation)
    return row


def auto_plan(
    model: ModelArg,
    devices: int | Mapping[str, int] | Sequence[int],
    *,
    batch: int | None = None,
    seq: int | None = None,
    memory_per_device: int | None = None,
    objective: str = "latency",
    rates: Rates | None = None,
) -> tuple[onnx.ModelProto, AutoReport]:
    """The fastest layout of ``model`` on ``devices`` for a workload, as an annotated copy, and the report.

    Args:
        model: The model (ModelProto, path, bytes or onnx_ir.Model); not modified.
        devices: The device count (every ``data x tensor`` factorisation is searched), or a mesh
            shape: ``{"data": d, "tensor": t}`` or ``(d, t)`` (only that one).
        batch: The batch a call runs with (binds the inputs' first symbolic dim; data parallelism
            needs it). Default: the model's, else 1.
        seq: The length every other symbolic input dim is bound to (default 128).
        memory_per_device: Bytes a device may hold (parameters, activations, optimizer state for
            ``train``); default: the hand plan's (module docstring). When no data x tensor layout
            fits a given limit, pipeline x tensor layouts are weighed (`sharding.auto.pipelines`).
        objective: ``latency`` (one call), ``throughput`` (calls per second at ``batch``; the same
            ranking while pipelines are not searched) or ``train`` (forward, backward, gradient
            all-reduce; optimizer state in memory).
        rates: The backend's rates (`onnx2jax.runtime.calibration.rates`); default `DEFAULT_RATES`.

    Returns:
        The annotated copy (configuration ``auto``) and the `AutoReport`.

    Raises:
        MeshShapeError: ``devices`` is not a count or a mesh shape that exists.
        DeviceSplitError: no layout on more than one device splits anything.
        MemoryLimitError: no layout fits ``memory_per_device`` (the message names the smallest).
        ValueError: an unknown objective.
    """
    started = time.perf_counter()
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    num_devices, shape = _mesh(devices)
    rates = rates or DEFAULT_RATES
    proto = as_model_proto(model)
    shapes = declared_shapes(proto, batch or 1, seq or DEFAULT_SEQUENCE)
    analysis = PlanAnalysis(proto, shapes)
    hand = hand_plan(analysis, num_devices, batch)
    hand_eval = analysis.evaluate(hand.written, num_devices)
    hand_cost = predict(hand_eval, rates, objective, hand.data)
    if memory_per_device is None:  # neither more memory nor more parameter bytes than the hand plan
        limit, param_limit = hand_cost.memory, hand_cost.param_bytes
        source = f"not given: the hand plan's, with at most its {param_limit:,} parameter bytes"
    else:
        limit, param_limit, source = int(memory_per_device), None, "given"
    rows, chosen, pruned = [], {}, []
    for candidate in candidates(analysis, num_devices, batch):
        if shape is not None and (candidate.data, candidate.tensor) != shape:
            continue
        # Pruning by memory: a data degree replicates the tensor layout's parameters, so their bytes per
        # device are known from its specs alone, before any lifting or inference.
        params = max(analysis.param_bytes(candidate.base, candidate.tensor).values(), default=0)
        if params > limit or (param_limit is not None and params > param_limit):
            pruned.append((candidate, params))
            continue
        if _evaluated(analysis, candidate, rates, objective, limit, param_limit, num_devices, rows, chosen) is None:
            continue
    if memory_per_device is not None and shape is None and not any(r.fits for r in rows):
        _pipelines(analysis, num_devices, batch, seq, rates, objective, limit, rows, chosen)
    if not any(r.fits for r in rows):  # the exact memory of every layout, for the error's smallest
        for candidate, _ in pruned:
            _evaluated(analysis, candidate, rates, objective, limit, param_limit, num_devices, rows, chosen)
        pruned = []
    rows += [Row(c.name, c.data, c.tensor, c.variant, dict.fromkeys(KINDS, 0), 0, params, params, math.inf,
                 math.inf, math.inf, False, (), True) for c, params in pruned]
    if shape is not None and not rows:
        raise MeshShapeError(f"mesh shape data {shape[0]} x tensor {shape[1]} does not exist for this model: "
                             f"data parallelism needs a batch divisible by {shape[0]} (batch {batch})")
    rows.sort(key=_key)
    _check_split(analysis, rows, num_devices, batch)
    if not rows[0].fits:
        _memory_error(rows, limit, num_devices)
    best = rows[0]
    candidate, evaluation = chosen[best.name]

    def write(name: str) -> tuple[onnx.ModelProto, Evaluation, tuple[str, ...]]:
        if name not in chosen:
            raise KeyError(f"no evaluated candidate named {name!r}; evaluated: {sorted(chosen)}")
        written, evaluated = chosen[name]
        model = written.model if isinstance(written, Pipeline) else write_plan(analysis, written.written, num_devices)
        return model, evaluated, written.notes

    annotated = write(best.name)[0]
    report = AutoReport(
        devices=num_devices, objective=objective, batch=batch, seq=seq, memory_limit=limit, limit_source=source,
        rates=rates, rows=rows, winner=best, hand=_row(hand, hand_eval, hand_cost, limit, param_limit),
        search_seconds=time.perf_counter() - started, evaluation=evaluation, notes=candidate.notes, writer=write,
    )
    _log.info("auto plan: %s", report.lines()[0])
    return annotated, report


def _pipelines(analysis, num_devices, batch, seq, rates, objective, limit, rows, chosen) -> None:
    """Pipeline x tensor layouts, fewest stages first, until one fits the limit (`sharding.auto.pipelines`)."""
    for pipe in pipelines(analysis, num_devices, batch, seq):
        evaluation = evaluate_pipeline(analysis, pipe, num_devices)
        cost = predict(evaluation, rates, objective)
        row = Row(name=pipe.name, data=1, tensor=pipe.tensor, variant="pipeline", collectives=evaluation.counts(),
                  collective_bytes=evaluation.collective_bytes, param_bytes=cost.param_bytes, memory=cost.memory,
                  seconds=cost.seconds, communication=cost.communication, compute=cost.compute,
                  fits=not evaluation.errors and cost.memory <= limit, errors=evaluation.errors,
                  pipeline=pipe.pipeline)
        rows.append(row)
        chosen[row.name] = (pipe, evaluation)
        if row.fits:
            return


def _check_split(analysis: PlanAnalysis, rows: list[Row], num_devices: int, batch: int | None) -> None:
    if num_devices == 1:
        return
    splits = [r for r in rows if not r.errors and (r.data > 1 or r.param_bytes < analysis.param_total)]
    if any(r.pruned for r in rows):
        return
    if not splits:
        raise DeviceSplitError(
            f"{num_devices} devices cannot split this model: no attention head count, width or channel count "
            f"of its column/row pairs has a factor in common with {num_devices}, and data parallelism needs a "
            f"batch divisible by a factor of it (batch {batch}); use a device count that divides the heads "
            "(or widths), or give such a batch"
        )


def _memory_error(rows: list[Row], limit: int, num_devices: int) -> None:
    valid = [r for r in rows if not r.errors and not r.pruned]
    smallest = min(valid, key=lambda r: r.memory)
    raise MemoryLimitError(
        f"no layout on {num_devices} devices fits {limit:,} bytes per device: the smallest is "
        f"{smallest.memory:,} bytes per device ({smallest.name}: {smallest.param_bytes:,} of parameters); "
        f"allow at least {smallest.memory:,} bytes per device, or more devices"
    )


__all__ = ["AutoReport", "Row", "auto_plan"]
