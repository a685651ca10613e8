"""What :meth:`onnx2jax.runtime.pipeline.PipelineCompiled.report` measures (:func:`measure`): a line per stage,
and its table."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import numpy as np

from onnx2jax.runtime.report import count_collectives, param_bytes_per_device
from onnx2jax.x64 import x64_scope

if TYPE_CHECKING:
    from onnx2jax.runtime.pipeline import PipelineCompiled


@dataclasses.dataclass
class StageReport:
    """One stage's line of :meth:`PipelineCompiled.report`.

    ``param_bytes_per_device`` is keyed by jax device id; ``sent_bytes`` is
    what one micro-batch sends to later stages; ``seconds`` one micro-batch
    of the stage alone.
    """

    stage: int
    nodes: int
    first_node: str
    last_node: str
    devices: tuple[int, ...]
    param_bytes_per_device: dict[int, int]
    sent_bytes: int
    collectives: dict[str, int]
    seconds: float


@dataclasses.dataclass
class PipelineReport:
    """What :meth:`PipelineCompiled.report` measured.

    ``seconds`` is the whole pipelined call's best of ``repeats``, each timed
    right before the stages alone, so that the bubble fraction compares times
    taken alike; it is not the mean per call a caller times back to back
    (``onnx2jax run`` prints that one too, and says so).
    """

    stages: list[StageReport]
    microbatches: int
    seconds: float
    bubble: float
    bound: float
    repeats: int

    def render(self, console=None) -> None:
        """Prints the report as a table (rich)."""
        from rich.console import Console
        from rich.table import Table

        if console is None:
            console = Console()
            console = Console(width=max(console.width, 150))  # rows stay one line
        table = Table(title=f"pipeline: {len(self.stages)} stages, {self.microbatches} micro-batches", box=None)
        for column in ("stage", "nodes", "devices", "param B/device", "sent B/mb", "collectives", "ms/mb"):
            table.add_column(column, overflow="fold")
        for row in self.stages:
            per_device = sorted(row.param_bytes_per_device.values()) or [0]
            collectives = ", ".join(f"{k} {v}" for k, v in row.collectives.items() if v) or "none"
            table.add_row(
                str(row.stage),
                f"{row.nodes} ({row.first_node}..{row.last_node})",
                _devices(row.devices),
                f"{per_device[-1]:,}",
                f"{row.sent_bytes:,}",
                collectives,
                f"{row.seconds * 1e3:.2f}",
            )
        console.print(table)
        best = f"best of {self.repeats}"
        console.print(f"(mb: one micro-batch; ms/mb: the stage alone on one micro-batch, {best})")
        call = f"{self.seconds * 1e3:.2f} ms"
        console.print(f"bubble fraction {self.bubble:.3f}; fill-drain bound (S-1)/(M+S-1) = {self.bound:.3f}")
        console.print(f"(bubble: 1 - M x sum(ms/mb) / (S x {call}); {call}: the pipelined call's {best}, "
                      "each timed next to the stages)")


def measure(
    pipeline: "PipelineCompiled", inputs: Sequence[Any], named: Mapping[str, Any], repeats: int
) -> PipelineReport:
    """Times the pipeline and each stage alone, alternately (see :meth:`PipelineCompiled.report`)."""
    jax.block_until_ready(pipeline(*inputs, **named))  # compiles everything, records stage inputs
    wall: list[float] = []
    alone: list[list[float]] = [[] for _ in pipeline.stages]
    outputs: list[tuple] = [()] * len(pipeline.stages)
    with x64_scope(pipeline.uses_64bit):
        for _ in range(repeats):  # alternated, so that machine noise hits both alike
            start = time.perf_counter()
            jax.block_until_ready(pipeline(*inputs, **named))
            wall.append(time.perf_counter() - start)
            for k, stage in enumerate(pipeline.stages):
                start = time.perf_counter()
                outputs[k] = jax.block_until_ready(stage.compiled(**pipeline.stage_args[k]))
                alone[k].append(time.perf_counter() - start)
        crossing = {(t, f) for t, f, _ in pipeline.partition.crossing}
        rows = []
        for k, stage in enumerate(pipeline.stages):
            args = pipeline.stage_args[k]
            sent = sum(
                int(np.prod(out.shape)) * out.dtype.itemsize
                for name, out in zip(stage.outputs, outputs[k])
                if (name, stage.stage) in crossing
            )
            rows.append(
                StageReport(
                    stage=stage.stage,
                    nodes=len(stage.nodes),
                    first_node=stage.nodes[0],
                    last_node=stage.nodes[-1],
                    devices=stage.devices,
                    param_bytes_per_device=param_bytes_per_device(stage.compiled.stored_params),
                    sent_bytes=sent,
                    collectives=count_collectives(stage.compiled.compiled_text(**args)),
                    seconds=min(alone[k]),
                )
            )
    call = min(wall)
    busy = sum(pipeline.microbatches * r.seconds for r in rows)
    return PipelineReport(
        stages=rows,
        microbatches=pipeline.microbatches,
        seconds=call,
        bubble=1.0 - busy / (len(rows) * call),
        bound=(len(rows) - 1) / (pipeline.microbatches + len(rows) - 1),
        repeats=repeats,
    )


def _devices(devices: Sequence[int]) -> str:
    if len(devices) > 2 and list(devices) == list(range(devices[0], devices[0] + len(devices))):
        return f"{devices[0]}..{devices[-1]}"
    return ",".join(map(str, devices))


__all__ = ["PipelineReport", "StageReport", "measure"]
