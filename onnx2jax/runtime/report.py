"""What a compiled sharded program costs, and how its specs came out: :class:`Report`.

``Compiled.report()`` (:mod:`onnx2jax.runtime.spmd`) and the pipeline's and
segmented run's reports build on these: the collectives counted in the
compiled HLO text, the parameter bytes each device holds, one row per node
input and output with a spec, and the note on a scanned loop's collectives.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import numpy as np

from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.runtime.scan_sharded import loop_collectives
from sharding.text import format_spec

if TYPE_CHECKING:
    import sharding
    from onnx2jax.runtime.tpu_report import TpuReport
    from onnx2jax.translate import JaxModel

_COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def node_rows(
    inference: "sharding.Inference | None", placements: Mapping[SpecKey, TensorPlacement]
) -> list[tuple[str, str, str, str, str]]:
    """Per node input and output with a spec: node, tensor, spec, given/inferred, PartitionSpec."""
    rows = []
    if inference is None:
        return rows
    for name, node in inference.nodes.items():
        for kind, specs, given in (("in", node.inputs, node.given_inputs), ("out", node.outputs, node.given_outputs)):
            for position, spec in enumerate(specs):
                if spec is None:
                    continue
                placement = placements.get(SpecKey(name, kind, position, spec.tensor_name))
                pspec = str(placement.sharding.spec) if placement else "-"
                origin = "given" if given[position] else "inferred"
                rows.append((f"{name} ({node.op_type})", f"{kind} {spec.tensor_name}", _short(format_spec(spec)), origin, pspec))
    return rows


def loop_note(model: JaxModel, text: str) -> list[str]:
    """For scanned layers: the collectives a call runs, the loop's body counted once per layer."""
    split = loop_collectives(text, count_collectives) if model.scan.active else None
    if split is None:
        return []
    outside, inside, trip = split
    body = ", ".join(f"{k} {v}" for k, v in inside.items() if v) or "no collectives"
    total = ", ".join(f"{k} {outside[k] + trip * v}" for k, v in inside.items() if outside[k] + trip * v) or "none"
    return [
        f"the collectives above are the program text's: the while loop's body (one layer) holds {body} "
        f"and runs {trip} times, so a call runs {total}"
    ]


def count_collectives(hlo_text: str) -> dict[str, int]:
    """Counts collective instructions in compiled HLO text (async start/done pairs count once)."""
    counts = {}
    for kind in _COLLECTIVES:
        pattern = re.compile(rf"=\s*[^=\n]*?\b{kind}(?:-start)?\(")
        counts[kind] = len(pattern.findall(hlo_text))
    return counts


def param_bytes_per_device(params: Mapping[str, "jax.Array | jax.ShapeDtypeStruct"]) -> dict[int, int]:
    """Bytes of parameters each device holds, by device id, from each array's shape, dtype and sharding.

    Placed arrays and abstract ones (ShapeDtypeStructs with a sharding: a program compiled for a target
    whose devices are not attached) alike: nothing is read from a device.
    """
    per_device: dict[int, int] = {}
    for array in params.values():
        itemsize = np.dtype(array.dtype).itemsize
        for device, index in array.sharding.devices_indices_map(tuple(array.shape)).items():
            size = math.prod(len(range(*i.indices(n))) for i, n in zip(index, array.shape))
            per_device[device.id] = per_device.get(device.id, 0) + size * itemsize
    return per_device


@dataclasses.dataclass
class Report:
    """What :meth:`onnx2jax.runtime.spmd.Compiled.report` measured."""

    mesh: dict[str, int]
    configuration: str | None
    collectives: dict[str, int]
    param_bytes_per_device: dict[int, int]
    param_bytes_total: int
    temp_bytes: int | None
    node_specs: list[tuple[str, str, str, str, str]]
    notes: list[str]
    tpu: "TpuReport | None" = None  # a TPU program's memory per chip, ICI/DCN collectives, cost (tpu_report)

    def render(self, console=None, *, every_spec: bool = False) -> None:
        """Prints the report as tables (rich).

        Args:
          every_spec: list inferred specs too, not only the ones written in the model.
        """
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        rows = [r for r in self.node_specs if every_spec or r[3] == "given"]
        inferred = sum(1 for r in self.node_specs if r[3] == "inferred")
        title = "sharding specs" + ("" if every_spec else f" written in the model (+{inferred} inferred, not shown)")
        table = Table(title=title, box=None, pad_edge=False)
        for column in ("node", "tensor", "spec", "from", "PartitionSpec"):
            table.add_column(column, overflow="fold")  # at 80 columns a long name folds, nothing is cut
        for row in rows:
            table.add_row(*row)
        console.print(table)
        console.print(f"mesh {self.mesh}  configuration {self.configuration!r}")
        console.print("collectives: " + ", ".join(f"{k} {v}" for k, v in self.collectives.items()))
        per_device = sorted(self.param_bytes_per_device.values())
        if per_device:
            console.print(
                f"parameter bytes per device: {per_device[-1]:,} (max) / {per_device[0]:,} (min); "
                f"unsharded total {self.param_bytes_total:,}"
            )
        for note in self.notes:
            console.print(f"note: {note}")
        if self.tpu is not None:
            self.tpu.render(console)


def _short(text: str) -> str:
    """Spec text with runs of consecutive devices written as ranges: [0,1,2,3] -> [0..3]."""

    def compact(match: re.Match) -> str:
        numbers = [int(n) for n in match.group(1).split(",")]
        if len(numbers) > 2 and numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{match.group(0)[0]}{numbers[0]}..{numbers[-1]}{match.group(0)[-1]}"
        return match.group(0)

    return re.sub(r"[\[{]([0-9]+(?:,[0-9]+)+)[\]}]", compact, text)


def example_inputs(
    inputs: Sequence[Any], named: Mapping[str, Any], last: tuple | None
) -> tuple[Sequence[Any], Mapping[str, Any]]:
    """The inputs a ``report()`` measures with: those given, else ``last`` (the last call's).

    Raises:
      ValueError: none given and the model was never called.
    """
    if inputs or named:
        return inputs, named
    if last is None:
        raise ValueError("report() needs example inputs, or call the model once first")
    return last
