"""What :meth:`onnx2jax.runtime.pipeline.PipelineCompiled.report` measured: a line per stage, and its table."""

from __future__ import annotations

import dataclasses
from typing import Sequence


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


def _devices(devices: Sequence[int]) -> str:
    if len(devices) > 2 and list(devices) == list(range(devices[0], devices[0] + len(devices))):
        return f"{devices[0]}..{devices[-1]}"
    return ",".join(map(str, devices))


__all__ = ["PipelineReport", "StageReport"]
