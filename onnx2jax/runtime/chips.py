"""The TPU chips a program can be compiled for, with the published per-chip figures a roofline needs.

Figures are Google Cloud TPU documentation's per-chip specifications (peak bf16 compute, HBM capacity,
HBM bandwidth), read from the system-architecture table of each version's page:

- v4:  https://cloud.google.com/tpu/docs/v4  : 275 TFLOPs bf16, 32 GiB HBM2, 1200 GBps
- v5e: https://cloud.google.com/tpu/docs/v5e : 197 TFLOPs bf16, 16 GB HBM2, 819 GBps
- v5p: https://cloud.google.com/tpu/docs/v5p : 459 TFLOPs bf16, 95 GiB HBM2e, 2765 GBps
- v6e: https://cloud.google.com/tpu/docs/v6e : 918 TFLOPs bf16, 32 GB HBM, 1638 GBps

The docs write the capacities as GB or GiB from one page to another; the chips hold binary gibibytes
(the TPU compiler of libtpu 0.0.42.1 offers 15.75 GiB of a v5e's 16 GiB to a program, the rest is the
runtime's), so capacities here are GiB. Bandwidths are decimal (10^9 bytes per second) as published.

jax names a chip by its devices' ``device_kind`` (``"TPU v5 lite"`` is a v5e); :func:`chip_of` maps one to
the other and refuses a kind it does not know, naming those it does.

A jax device is a chip, but for v4 topologies of libtpu 0.0.42.1, whose devices are the chip's two
TensorCores (``core_on_chip`` 0 and 1 at one ``coords``; the compiler offers each 15.25 GiB): there
:meth:`Chip.per_device` halves the figures, HBM bandwidth included (the cores share it).
"""

from __future__ import annotations

import dataclasses
from typing import Any

_GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU chip's published figures.

    Attributes:
      name: the version as jax's topologies spell it (``"v5e"``).
      device_kind: what a jax device of that chip reports as ``device_kind``.
      hbm_bytes: HBM capacity per chip.
      peak_bf16_flops: peak bf16 floating-point operations per second per chip.
      hbm_bytes_per_second: HBM bandwidth per chip.
      devices_per_chip: 1, or the jax devices sharing one chip's figures (:meth:`per_device`).
    """

    name: str
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    hbm_bytes_per_second: float
    devices_per_chip: int = 1

    def per_device(self, devices_per_chip: int) -> "Chip":
        """This chip's share per jax device where a chip is ``devices_per_chip`` devices (v4's cores)."""
        if devices_per_chip == 1:
            return self
        n = devices_per_chip
        return dataclasses.replace(self, name=f"{self.name} (1/{n} chip)", hbm_bytes=self.hbm_bytes // n,
                                   peak_bf16_flops=self.peak_bf16_flops / n,
                                   hbm_bytes_per_second=self.hbm_bytes_per_second / n, devices_per_chip=n)

    def roofline_seconds(self, flops: float, bytes_accessed: float) -> float:
        """The least time a program of ``flops`` operations reading and writing ``bytes_accessed`` of HBM
        takes on this chip: the longer of compute at peak and traffic at full bandwidth."""
        return max(flops / self.peak_bf16_flops, bytes_accessed / self.hbm_bytes_per_second)


CHIPS: dict[str, Chip] = {
    chip.name: chip
    for chip in (
        Chip("v4", "TPU v4", 32 * _GIB, 275e12, 1200e9),
        Chip("v5e", "TPU v5 lite", 16 * _GIB, 197e12, 819e9),
        Chip("v5p", "TPU v5", 95 * _GIB, 459e12, 2765e9),
        Chip("v6e", "TPU v6 lite", 32 * _GIB, 918e12, 1638e9),
    )
}


def chip_of(device: Any) -> Chip:
    """The chip of a jax TPU device (a compile-only topology device included), from its ``device_kind``.

    Raises:
      ValueError: a device kind not in :data:`CHIPS` (a CPU or GPU device, or a TPU version not listed).
    """
    kind = getattr(device, "device_kind", str(device))
    for chip in CHIPS.values():
        if chip.device_kind == kind:
            return chip
    known = ", ".join(f"{c.name} ({c.device_kind!r})" for c in CHIPS.values())
    raise ValueError(f"device kind {kind!r} is not a TPU chip onnx2jax has figures for; it knows {known}")
