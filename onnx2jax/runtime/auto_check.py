"""The automatic plan's winner, compiled: its collectives and bytes against the prediction (issue 31).

`measured` reads the compiled HLO text: each collective's kind and the bytes of
its result on one device (the array, or the arrays of a tuple collective such
as a combined all-reduce; an async ``-start``'s last array, its result), and
the parameter bytes each device holds. `check` puts that into the
`sharding.auto.AutoReport` and names every difference from the prediction:
counts per kind, bytes, parameter bytes, and node by node the notes of
`onnx2jax.runtime.collective_sources` (a collective XLA added, or one it
merged).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from onnx2jax.runtime.report import count_collectives

_KINDS = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
_LINE = re.compile(r"=\s*(\([^=\n]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+(" + "|".join(_KINDS) + r")(-start)?\(")
_ARRAY = re.compile(r"([a-z]+)([0-9]*)\[([0-9,]*)\]")
_PRED = {"pred": 1}


def _array_bytes(dtype: str, bits: str, dims: str) -> int:
    size = _PRED.get(dtype + bits) or max(int(bits or 8) // 8, 1)
    return size * math.prod(int(d) for d in dims.split(",") if d)


def collective_bytes(hlo_text: str) -> list[tuple[str, int]]:
    """Every collective of compiled HLO text: (kind, bytes of its result on one device)."""
    found = []
    for match in _LINE.finditer(hlo_text):
        arrays = [_array_bytes(*a) for a in _ARRAY.findall(match.group(1))]
        size = arrays[-1] if match.group(3) and len(arrays) > 1 else sum(arrays)
        found.append((match.group(2), size))
    return found


def measured(hlo_text: str, param_bytes_per_device: Mapping[int, int]) -> dict[str, Any]:
    """The compiled program's collectives by kind, their bytes, and the most parameter bytes on a device."""
    return {
        "collectives": count_collectives(hlo_text),
        "collective_bytes": sum(size for _, size in collective_bytes(hlo_text)),
        "param_bytes": max(param_bytes_per_device.values(), default=0),
    }


def _pipeline_measured(executable: Any, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A pipeline's stages: their collectives summed (the sends between stages are not collectives of a
    stage's program: each cut counts as one collective-permute), the most parameter bytes on a device."""
    run_report = executable.report(**inputs, repeats=1)
    counts = dict.fromkeys(_KINDS, 0)
    for stage in run_report.stages:
        for kind, count in stage.collectives.items():
            counts[kind] = counts.get(kind, 0) + count
    counts["collective-permute"] += len(run_report.stages) - 1
    params = max((b for stage in run_report.stages for b in stage.param_bytes_per_device.values()), default=0)
    return {"collectives": counts, "collective_bytes": None, "param_bytes": params}, []


def check(executable: Any, report: Any, inputs: Mapping[str, Any]) -> Any:
    """Fills ``report.measured`` and ``report.differences`` from the compiled ``executable`` at ``inputs``.

    A pipeline (no one program text) is read stage by stage; its collective bytes are not measured."""
    if not hasattr(executable, "compiled_text"):
        report.measured, notes = _pipeline_measured(executable, inputs)
    else:
        text = executable.compiled_text(**inputs)
        run_report = executable.report(**inputs)
        report.measured = measured(text, run_report.param_bytes_per_device)
        notes = [n for n in run_report.notes if n.startswith(("XLA added", "inference predicted"))]
    m, w = report.measured, report.winner
    differences = []
    for kind in _KINDS:
        if m["collectives"].get(kind, 0) != w.collectives.get(kind, 0):
            differences.append(f"{kind}: predicted {w.collectives.get(kind, 0)}, the program has "
                               f"{m['collectives'].get(kind, 0)}")
    if m["collective_bytes"] is not None and m["collective_bytes"] != w.collective_bytes:
        differences.append(f"collective bytes: predicted {w.collective_bytes:,}, the program moves "
                           f"{m['collective_bytes']:,}")
    if m["param_bytes"] != w.param_bytes:
        differences.append(f"parameter bytes per device: predicted {w.param_bytes:,}, placed {m['param_bytes']:,}")
    differences += notes
    report.differences = differences
    return report


__all__ = ["check", "collective_bytes", "measured"]
