"""Automatic plans against a TPU target (issue 41, item 7): the cost model ranks, the TPU compiler re-ranks.

`sharding.auto.auto_plan` ranks every candidate layout by its cost model (rates of an attached backend,
or the defaults). For a target whose chips are not attached, that ranking is a guess at the TPU's
numbers: :func:`rerank` compiles the best few candidates (``top``, default 3) for the target
(``onnx2jax.compile(..., configuration="auto", target=)``, passed in by the front door, which this
runtime module does not import; lowered at the workload's shapes and compiled by the TPU compiler
through :func:`onnx2jax.runtime.tpu_report.compile_and_report`) and ranks them again by what the
compiler says: a candidate whose peak per chip exceeds the chip's HBM (or the ``memory_per_device``
the user gave) is out, the rest are ordered by the compiler's time estimate. The winner is the
first of that ranking; :class:`TargetRanking` holds both rankings (``explain --auto --target`` prints
them side by side).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import onnx

from onnx2jax.errors import ChipMemoryError, MemoryLimitError
from onnx2jax.runtime.executable import Executable
from onnx2jax.runtime.targets import Target
from onnx2jax.runtime.chips import Chip
from onnx2jax.runtime.tpu_report import TpuReport, compile_and_report, device_chip
from sharding.auto.search import AutoReport, Row

DEFAULT_TOP = 3
"""How many of the cost model's best candidates are compiled for the target."""


@dataclasses.dataclass(frozen=True)
class TargetCandidate:
    """One candidate as the cost model ranked it and as the TPU compiler saw it.

    Attributes:
      row: the cost model's row (its ``seconds`` and ``memory`` are the prediction).
      model_rank: its place in the cost model's ranking (1 is the cost model's first choice).
      tpu: the TPU compiler's report (None where the compiler refused the program: ``refused`` says why).
      refused: the compiler's out-of-memory refusal (:class:`ChipMemoryError`'s words), else None.
      limit_bytes: bytes per chip the candidate may use: the chip's HBM, or less where the user gave less.
    """

    row: Row
    model_rank: int
    tpu: TpuReport | None
    refused: str | None
    limit_bytes: int

    @property
    def fits(self) -> bool:
        """The compiler compiled it and its peak per chip is within ``limit_bytes``."""
        return self.tpu is not None and self.tpu.memory.peak_bytes <= self.limit_bytes

    def key(self) -> tuple:
        """The TPU ranking's order: those that fit first, then the compiler's time estimate, then the model's."""
        seconds = self.tpu.cost.seconds if self.tpu is not None else float("inf")
        return (not self.fits, seconds, self.model_rank)


@dataclasses.dataclass(frozen=True)
class TargetRanking:
    """The best few candidates of an automatic plan, compiled for a target and ranked again.

    Attributes:
      target: the target's name (``"tpu:v5e:2x4"``).
      shapes: the input shapes every candidate was compiled at.
      candidates: in the TPU compiler's order (the winner first; those that do not fit last).
    """

    target: str
    shapes: dict[str, tuple[int, ...]]
    candidates: tuple[TargetCandidate, ...]

    @property
    def winner(self) -> TargetCandidate:
        return self.candidates[0]

    def table(self) -> list[tuple[str, ...]]:
        """Rows of both rankings: TPU rank, cost-model rank, name, predicted us and bytes, the compiler's peak
        bytes per chip, its estimate in us, ICI and DCN bytes per chip, and whether it fits."""
        out = []
        for i, c in enumerate(self.candidates, 1):
            tpu = c.tpu
            out.append((
                str(i) if c.fits else "out", str(c.model_rank), c.row.name, f"{c.row.seconds * 1e6:,.1f}",
                f"{c.row.memory:,}", "refused" if tpu is None else f"{tpu.memory.peak_bytes:,}",
                "-" if tpu is None else f"{tpu.cost.seconds * 1e6:,.2f}",
                "-" if tpu is None else f"{tpu.network_bytes('ICI'):,}",
                "-" if tpu is None else f"{tpu.network_bytes('DCN'):,}",
                "yes" if c.fits else ("no: " + c.refused if c.refused else
                                      f"no: over {c.limit_bytes:,} bytes per chip"),
            ))
        return out

    HEADER = ("TPU rank", "model rank", "candidate", "predicted us", "predicted bytes/dev", "TPU peak bytes/chip",
              "TPU estimate us", "ICI bytes/chip", "DCN bytes/chip", "fits")

    def lines(self) -> list[str]:
        """Both rankings as plain text (a header, then one line per candidate), for `AutoReport.lines`."""
        where = ", ".join(f"{k} {list(v)}" for k, v in self.shapes.items())
        rows = [self.HEADER, *self.table()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER))]
        out = [f"re-ranked for {self.target} by the TPU compiler at {where} (the best {len(self.candidates)} of "
               f"the cost model's ranking; winner: {self.winner.row.name}):"]
        out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        return out

    def as_dict(self) -> dict:
        """The table as data (``explain --auto --target --json``)."""
        return {"target": self.target, "shapes": {k: list(v) for k, v in self.shapes.items()},
                "candidates": [dict(zip(self.HEADER, row)) for row in self.table()]}


def rerank(
    report: AutoReport,
    target: Target,
    shapes: Mapping[str, Sequence[int]],
    compile_candidate: Callable[[onnx.ModelProto], Executable],
    *,
    top: int = DEFAULT_TOP,
    memory_per_device: int | None = None,
) -> tuple[onnx.ModelProto, TargetRanking]:
    """The best ``top`` candidates of ``report`` compiled for ``target`` at ``shapes`` and ranked by the TPU
    compiler (``compile_candidate``: an annotated candidate, configuration ``auto``, compiled for ``target``,
    as ``onnx2jax.compile`` does); returns the winner's annotated model and the ranking. ``report`` is
    updated: its ``target`` is the ranking, its ``winner`` (and ``evaluation``) the TPU ranking's first.

    Raises:
      ValueError: ``top`` < 1.
      MemoryLimitError: no compiled candidate fits the chip's HBM (a :class:`ChipMemoryError`, naming the
        chip) or the ``memory_per_device`` given; the message names the smallest peak and its candidate.
    """
    if top < 1:
        raise ValueError(f"top must be >= 1 (how many candidates to compile for {target.name}), got {top}")
    shapes = {k: tuple(int(d) for d in v) for k, v in shapes.items()}
    valid = [(i, row) for i, row in enumerate(report.rows, 1) if row.fits][:top]
    models, compiled = {}, []
    for rank, row in valid:
        models[row.name] = report.annotated(row.name)
        executable = compile_candidate(models[row.name])
        lowered = executable.lower(**shapes)
        try:
            _, tpu = compile_and_report(lowered, executable.mesh, what=f"candidate {row.name!r}")
            refused = None
        except ChipMemoryError as e:
            tpu, refused = None, str(e)
        hbm = tpu.memory.hbm_bytes if tpu is not None else _chip(target).hbm_bytes
        limit = hbm if memory_per_device is None else min(hbm, int(memory_per_device))
        compiled.append(TargetCandidate(row, rank, tpu, refused, limit))
    ranking = TargetRanking(target.name, shapes, tuple(sorted(compiled, key=TargetCandidate.key)))
    report.target = ranking
    if not ranking.winner.fits:
        _refuse(ranking, _chip(target), memory_per_device)
    report.choose(ranking.winner.row.name)
    return models[ranking.winner.row.name], ranking


def _chip(target: Target) -> Chip:
    return device_chip(target.devices())


def _refuse(ranking: TargetRanking, chip: Chip, memory_per_device: int | None) -> None:
    """No candidate fits: the error names the chip (or the limit given), the smallest peak and its candidate."""
    peaks = [c for c in ranking.candidates if c.tpu is not None]
    names = ", ".join(c.row.name for c in ranking.candidates)
    if not peaks:
        raise ChipMemoryError(chip.name, None, chip.hbm_bytes,
                              f"every candidate compiled for {ranking.target} ({names}; the compiler refused each)")
    smallest = min(peaks, key=lambda c: c.tpu.memory.peak_bytes)  # type: ignore[union-attr]
    peak, hbm = smallest.tpu.memory.peak_bytes, smallest.tpu.memory.hbm_bytes  # type: ignore[union-attr]
    if peak > hbm:
        raise ChipMemoryError(smallest.tpu.chip.name, peak, hbm,  # type: ignore[union-attr]
                              f"the smallest of the candidates compiled for {ranking.target} ({smallest.row.name})")
    raise MemoryLimitError(
        f"no candidate compiled for {ranking.target} fits memory_per_device {memory_per_device:,} bytes per chip: "
        f"the smallest TPU peak is {peak:,} bytes ({smallest.row.name}; the compiler pads each shard to its tiles, "
        f"so the cost model's bytes per device are lower); compiled: {names}; allow at least {peak:,} bytes"
    )


__all__ = ["DEFAULT_TOP", "TargetCandidate", "TargetRanking", "rerank"]
