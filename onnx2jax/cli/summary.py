"""The short summary ``run`` and ``demo`` print of a compiled run: the headline figures, once each.

Every execution's report (one SPMD program, pipeline stages, segments) has its own
tables (``--verbose`` prints them); by default a command prints only what a user
reads first: where it ran, the collectives per call, the parameter bytes per
device, and for a pipeline its stages and bubble. Notes are printed once each,
whichever part of the report repeats them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def headline(report: Any) -> list[str]:
    """The figures a user reads first from a compiled run's report, as plain lines."""
    lines: list[str] = []
    stages = getattr(report, "stages", None)
    if stages is not None:  # a pipeline
        devices = sorted({d for stage in stages for d in stage.devices})
        lines.append(
            f"pipeline: {len(stages)} stages on {len(devices)} devices, {report.microbatches} micro-batch(es); "
            f"bubble fraction {report.bubble:.3f} (fill-drain bound {report.bound:.3f})"
        )
        per_device = max((max(s.param_bytes_per_device.values(), default=0) for s in stages), default=0)
        collectives = _total(s.collectives for s in stages)
        lines.append(f"collectives per call: {_counts(collectives)}; parameter bytes per device at most {per_device:,}")
        return lines
    mesh = getattr(report, "mesh", None)
    configuration = getattr(report, "configuration", None)
    steps = getattr(report, "steps", None)
    where = f"mesh {mesh}" + (f", configuration {configuration!r}" if configuration else "")
    if steps is not None:  # segments
        hosts = sum(1 for s in steps if s.report is None)
        lines.append(f"sharded on {where}: {len(steps)} segments, {hosts} of them host steps")
        lines.append(f"collectives per call: {_counts(report.collectives)}")
        return lines
    lines.append(f"sharded on {where}")
    per_device = sorted(getattr(report, "param_bytes_per_device", {}).values())
    figures = f"collectives per call: {_counts(report.collectives)}"
    if per_device:
        figures += f"; parameter bytes per device {per_device[-1]:,} of {report.param_bytes_total:,}"
    lines.append(figures)
    return lines


def once(notes: Iterable[str], said: set[str]) -> list[str]:
    """``notes`` without those already in ``said`` (which grows): every note is printed once."""
    fresh = []
    for note in notes:
        key = note.strip()
        if key and key not in said:
            said.add(key)
            fresh.append(note)
    return fresh


def merged_stage_lines(text: str) -> list[str]:
    """``stage 0: X`` and ``stage 1: X`` (a pipeline's per-stage layers line) said once: ``stages 0, 1: X``."""
    groups: dict[str, list[str]] = {}
    plain: list[str] = []
    for line in text.splitlines():
        match = re.match(r"stage (\d+): (.*)", line)
        if match:
            groups.setdefault(match.group(2), []).append(match.group(1))
        elif line.strip():
            plain.append(line)
    merged = [f"stage{'s' if len(ids) > 1 else ''} {', '.join(ids)}: {rest}" for rest, ids in groups.items()]
    return plain + merged


def _total(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for one in counts:
        for kind, count in one.items():
            total[kind] = total.get(kind, 0) + count
    return total


def _counts(collectives: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in collectives.items() if count) or "none"
