"""What a program compiled for a TPU chip costs there: :class:`TpuReport`, read from the TPU executable.

From a jax ``Compiled`` for TPU devices (compile-only topology devices included) and its HLO text:

- **memory per chip**: argument, output and peak bytes (``memory_analysis()``; its
  ``temp_size_in_bytes`` is 0 on a TPU, ``peak_memory_in_bytes`` is what the program needs) against the
  chip's HBM (:mod:`onnx2jax.runtime.chips`), and by how much it fits or does not;
- **collectives per chip per call**, by kind, with the bytes each moves (an all-gather's result, a
  reduce-scatter's operand, the others' operand = result), ICI (within a slice) and DCN (across slices:
  the TPU compiler lowers those to megascale ``send``/``recv`` host transfers, one ``send`` each, whose
  ``_xla_megascale_transfer_type`` names the collective) apart; each attributed to the ONNX node its
  ``op_name`` names (:func:`onnx2jax.runtime.collective_sources.onnx_node`), or unattributed where the
  TPU compiler left it none; a loop body's collectives counted once per trip;
- **FLOPs and time** (:mod:`onnx2jax.runtime.tpu_cost`): the compiler's estimate corrected, beside the
  chip's roofline.

A compile that does not fit is refused by the TPU compiler with RESOURCE_EXHAUSTED; :func:`compile_for_tpu`
raises :class:`onnx2jax.errors.ChipMemoryError` instead, naming the chip and the bytes.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from onnx2jax.errors import ChipMemoryError
from onnx2jax.runtime.chips import Chip, chip_of
from onnx2jax.runtime.collective_sources import _KINDS, onnx_node
from onnx2jax.runtime.hlo_program import HloProgram, Instruction, array_bytes
from onnx2jax.runtime.tpu_cost import Cost, corrected_cost

_MEGASCALE = re.compile(r'_xla_megascale_transfer_type="([A-Z_]+)"')
# XLA's sizes in its out-of-memory messages: "17.00G", "512.00M".
_SIZE = r"([\d.]+)([KMGT]?)i?B?"
_OOM = (
    re.compile(rf"required for (.+?) \({_SIZE}\) exceeds available HBM \({_SIZE}\)"),
    re.compile(rf"Used {_SIZE} of {_SIZE} hbm"),
)


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective of the program: bytes and count per chip per call (a loop body's times its trips)."""

    kind: str
    network: str  # "ICI" within a slice, "DCN" across slices
    node: str | None
    bytes: int
    count: int
    instruction: str


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes per chip: the program's arguments, outputs and peak, against the chip's HBM.

    As the chip holds them: a TPU layout pads each array's minor dimensions to its tiles (a f32 [2, 16, 32]
    shard takes 16 KiB, not 4), so small or narrow shards take more than their elements' bytes.
    """

    argument_bytes: int
    output_bytes: int
    peak_bytes: int
    hbm_bytes: int

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hbm_bytes

    @property
    def headroom_bytes(self) -> int:
        """HBM left at the peak (negative: bytes over)."""
        return self.hbm_bytes - self.peak_bytes


@dataclasses.dataclass(frozen=True)
class TpuReport:
    """A TPU program's memory, collectives and cost per chip (see the module docstring)."""

    chip: Chip
    chips: int
    slices: int
    memory: Memory
    collectives: tuple[Collective, ...]
    cost: Cost

    def totals(self) -> dict[tuple[str, str], tuple[int, int]]:
        """(kind, network) -> (count, bytes) per chip per call."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for c in self.collectives:
            count, size = out.get((c.kind, c.network), (0, 0))
            out[(c.kind, c.network)] = (count + c.count, size + c.bytes)
        return out

    def network_bytes(self, network: str) -> int:
        """Bytes per chip per call over ``"ICI"`` or ``"DCN"``."""
        return sum(c.bytes for c in self.collectives if c.network == network)

    def bytes_per_slice(self, network: str) -> int:
        """Bytes per slice per call over ``network``: every chip of an SPMD program sends its own, so the
        chips of a slice send :meth:`network_bytes` each (data parallel across slices: DCN's is the
        gradient's bytes, the parameters' of one replica)."""
        return self.network_bytes(network) * (self.chips // self.slices)

    def headline(self) -> list[str]:
        """The figures a user reads first, as plain lines (as :func:`onnx2jax.cli.summary.headline`'s)."""
        m = self.memory
        fits = f"fits, {_gib(m.headroom_bytes)} free" if m.fits else f"does NOT fit, {_gib(-m.headroom_bytes)} over"
        networks = ", ".join(f"{n} {self.network_bytes(n):,} bytes" for n in ("ICI", "DCN") if self.network_bytes(n))
        if self.slices > 1:
            networks += f"; DCN {self.bytes_per_slice('DCN'):,} bytes per slice"
        return [
            f"{self.chips} TPU {self.chip.name} chip{'s' if self.chips > 1 else ''}: peak {_gib(m.peak_bytes)} of {_gib(m.hbm_bytes)} per chip "
            f"({fits})",
            f"collectives per chip per call: {sum(c.count for c in self.collectives)} ({networks or 'no bytes'}); "
            f"estimate {_seconds(self.cost.seconds)}, roofline {_seconds(self.cost.roofline_seconds)}",
        ]

    def check_fits(self) -> None:
        """Raises :class:`ChipMemoryError` when the peak exceeds the chip's HBM."""
        if not self.memory.fits:
            raise ChipMemoryError(self.chip.name, self.memory.peak_bytes, self.memory.hbm_bytes, "peak memory")

    def render(self, console: Any = None) -> None:
        """Prints the report as rich tables: memory, collectives by kind and node, cost beside the roofline."""
        from rich.console import Console
        from rich.table import Table

        console = console or Console()
        m, chip = self.memory, self.chip
        unit = "chip" if chip.devices_per_chip == 1 else "device"
        where = f"{self.chips} {chip.name} {unit}{'s' if self.chips > 1 else ''}"
        where += f" in {self.slices} slices" if self.slices > 1 else ""
        memory = Table(title=f"memory per {unit} ({where}, {_gib(chip.hbm_bytes)} HBM each)", box=None,
                       pad_edge=False)
        for column in ("arguments", "outputs", "peak", "HBM", "fits"):
            memory.add_column(column, justify="right")
        verdict = f"yes, {_gib(m.headroom_bytes)} free" if m.fits else f"NO, {_gib(-m.headroom_bytes)} over"
        memory.add_row(_gib(m.argument_bytes), _gib(m.output_bytes), _gib(m.peak_bytes), _gib(m.hbm_bytes), verdict)
        console.print(memory)
        table = Table(title="collectives per chip per call", box=None, pad_edge=False)
        for column in ("kind", "network", "count", "bytes", "ONNX node"):
            table.add_column(column, overflow="fold", justify="right" if column in ("count", "bytes") else "left")
        rows: dict[tuple[str, str, str], list[int]] = {}
        for c in self.collectives:
            row = rows.setdefault((c.kind, c.network, c.node or "(unattributed)"), [0, 0])
            row[0] += c.count
            row[1] += c.bytes
        for (kind, network, node), (count, size) in sorted(rows.items()):
            table.add_row(kind, network, str(count), f"{size:,}", node)
        console.print(table if rows else "collectives: none")
        cost = self.cost
        console.print(
            f"per chip per call: {cost.flops:,.0f} FLOPs, {cost.bytes_accessed:,.0f} bytes of HBM traffic; "
            f"compiler's estimate {_seconds(cost.seconds)} (as reported {_seconds(cost.compiler_seconds)}); "
            f"{chip.name} roofline {_seconds(cost.roofline_seconds)} "
            f"({chip.peak_bf16_flops / 1e12:g} TFLOP/s bf16, {chip.hbm_bytes_per_second / 1e9:g} GB/s)"
        )
        if cost.custom_calls:
            named = ", ".join(sorted(set(cost.custom_calls)))
            console.print(f"note: {len(cost.custom_calls)} custom calls ({named}) took 1 s each off the compiler's "
                          "estimate; added back")
        for name, trips, body_flops in cost.loops:
            console.print(f"note: loop {name} runs {trips} times; its body ({body_flops:,.0f} FLOPs) was counted once "
                          "by the compiler, counted per trip here")
        for note in cost.notes:
            console.print(f"note: {note}")


def compile_and_report(lowered: Any, devices: Any, *, what: str = "the program") -> tuple[Any, TpuReport]:
    """Compiles a jax ``Lowered`` for TPU devices and reports it: (the ``Compiled``, its :class:`TpuReport`).

    ``devices``: the program's Mesh or devices (their chip's figures are used). A compile the chip's memory
    cannot hold raises :class:`ChipMemoryError` (see :func:`compile_for_tpu`); one that compiles but whose
    peak exceeds the chip's HBM is reported, not refused (:meth:`TpuReport.check_fits` refuses it).
    """
    chip = device_chip(devices)
    compiled = compile_for_tpu(lowered, chip, what=what)
    return compiled, tpu_report(compiled, chip=chip)


def tpu_report(compiled: Any, *, chip: Chip | None = None, hlo_text: str | None = None) -> TpuReport:
    """The report of a TPU executable (a jax ``Compiled``), per chip per call.

    Args:
      compiled: ``jax.jit(f).lower(...).compile()`` for TPU devices (compile-only ones included).
      chip: the chip (default: from the devices of the executable's shardings).
      hlo_text: the executable's HLO (default ``compiled.as_text()``).
    """
    devices = _devices(compiled)
    chip = chip or device_chip(devices)
    program = HloProgram(hlo_text if hlo_text is not None else compiled.as_text())
    stats = compiled.memory_analysis()
    memory = Memory(stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.peak_memory_in_bytes,
                    chip.hbm_bytes)
    slices = len({getattr(d, "slice_index", 0) or 0 for d in devices})
    costs = compiled.cost_analysis()
    costs = costs[0] if isinstance(costs, (list, tuple)) else costs
    return TpuReport(chip, len(devices), slices, memory, tuple(collectives(program)),
                     corrected_cost(costs or {}, program, chip))


def collectives(program: HloProgram) -> list[Collective]:
    """Every collective of the program, ICI and DCN, with bytes and count per chip per call."""
    found = []
    runs = program.runs
    for computation, instructions in program.computations.items():
        times = runs.get(computation, 0)
        if not times:
            continue
        for instruction in instructions:
            kind, network, size = _collective(program, instruction)
            if kind:
                found.append(Collective(kind, network, onnx_node(instruction.op_name), size * times, times,
                                        instruction.name))
    return found


def _collective(program: HloProgram, instruction: Instruction) -> tuple[str, str, int]:
    """(kind, network, bytes) of a collective instruction; kind '' for any other."""
    opcode = instruction.opcode
    if opcode == "send" and "is_host_transfer=true" in instruction.attributes:
        transfer = _MEGASCALE.search(instruction.attributes)
        if transfer is None:
            return "", "", 0
        data = program.instructions.get(instruction.operands[0]) if instruction.operands else None
        return transfer.group(1).lower().replace("_", "-"), "DCN", array_bytes(data.shape) if data else 0
    kind = opcode.removesuffix("-start")
    if kind not in _KINDS:
        return "", "", 0
    result = array_bytes(instruction.shape)
    if opcode.endswith("-start"):  # the result is the matching -done's
        done = [u for u in program.users(instruction.name) if u.opcode == f"{kind}-done"]
        result = array_bytes(done[0].shape) if done else 0
    return kind, "ICI", max(result, program.operand_bytes(instruction))


def compile_for_tpu(lowered: Any, devices: Chip | Any, *, what: str = "the program") -> Any:
    """``lowered.compile()``, with the TPU compiler's out-of-memory refusal raised as :class:`ChipMemoryError`.

    Args:
      lowered: a jax ``Lowered`` for TPU devices.
      devices: the :class:`Chip`, or the program's Mesh or devices.
      what: the program, in words, for the message.
    """
    chip = devices if isinstance(devices, Chip) else device_chip(devices)
    try:
        return lowered.compile()
    except Exception as e:  # jax's JaxRuntimeError; only RESOURCE_EXHAUSTED is ours to translate
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise memory_error(str(e), chip, what) from None


def memory_error(message: str, chip: Chip, what: str = "the program") -> ChipMemoryError:
    """XLA's RESOURCE_EXHAUSTED message as a :class:`ChipMemoryError` naming the chip and the bytes."""
    for pattern in _OOM:
        match = pattern.search(message)
        if match is None:
            continue
        groups = match.groups()
        label = groups[0] if len(groups) == 5 else "memory"
        needed, available = _bytes(*groups[-4:-2]), _bytes(*groups[-2:])
        return ChipMemoryError(chip.name, needed, available, f"{what}'s {label}")
    return ChipMemoryError(chip.name, None, chip.hbm_bytes, what)


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit])


def device_chip(devices: Any) -> Chip:
    """The chip figures per device of ``devices`` (a Mesh, or devices: :func:`onnx2jax.runtime.chips.chip_of`),
    split where a chip is several of them (v4's TensorCores: :meth:`onnx2jax.runtime.chips.Chip.per_device`)."""
    held = getattr(devices, "devices", devices)  # a Mesh's array, a topology's list, or the devices themselves
    devices = list(np.asarray(held, dtype=object).flat)
    chip = chip_of(devices[0])
    places = {(getattr(d, "slice_index", 0), tuple(getattr(d, "coords", ()) or (d.id,))) for d in devices}
    return chip.per_device(len(devices) // len(places))


def _devices(compiled: Any) -> list[Any]:
    """The executable's devices, from its argument or result shardings."""
    import jax

    shardings = jax.tree.leaves((compiled.input_shardings, compiled.output_shardings))
    for sharding in shardings:
        devices = getattr(sharding, "_device_assignment", None)
        if devices:
            return list(devices)
    raise ValueError("the executable names no devices in its shardings: pass chip=")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB" if abs(n) >= 1 << 28 else f"{n / (1 << 20):.2f} MiB"


def _seconds(s: float) -> str:
    if abs(s) >= 1:
        return f"{s:.3f} s"
    return f"{s * 1e3:.3f} ms" if abs(s) >= 1e-3 else f"{s * 1e6:.1f} us"
