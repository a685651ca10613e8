"""Compile targets: the hardware a program is compiled for, which need not be attached.

A target names a TPU topology as jax spells it (``"v5e:2x4"``, ``"v5p:2x2x2"``,
``"v6e:2x4"``, ``"v4:2x2x1"``), written ``"tpu:v5e:2x4"`` (the ``tpu:``
prefix may be left out). libtpu (``pip install 'jax[tpu]'``, onnx2jax's
``tpu`` extra) holds the TPU compiler and gives *compile-only* devices for
such a topology on any Linux x86-64 machine
(``jax.experimental.topologies.get_topology_desc``): programs lower and
compile for them, nothing runs on them.

This module owns that lookup: it sets ``ALLOW_MULTIPLE_LIBTPU_LOAD`` before
the plugin starts (several processes may load libtpu at once: test workers,
a TPU VM's own process), caches each topology (libtpu builds it once per
process), and says what to install where libtpu is missing. Multi-slice
targets (``slices > 1``) come from the same call with ``num_slices``; their
mesh puts the data axis across slices (:func:`target_mesh`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import sys
import tempfile
from typing import Iterator, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from onnx2jax.errors import TargetError
from onnx2jax.platforms import accelerator_visible, prefer_cpu_without_accelerator

KNOWN_TOPOLOGIES: dict[str, tuple[str, ...]] = {
    "v4": ("2x2x1", "2x2x2", "2x2x4", "4x4x4"),
    "v5e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
    "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4"),
    "v6e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
}
"""Topologies :func:`list_targets` offers, per TPU generation (others jax spells are accepted as well)."""

INSTALL_HINT = "install libtpu: pip install 'jax[tpu]' (onnx2jax's tpu extra: pip install 'onnx2jax[tpu]')"


@dataclasses.dataclass(frozen=True)
class Target:
    """A compile target: a TPU topology, possibly several slices of it.

    Attributes:
      platform: ``"tpu"``.
      topology: as jax spells it, ``"v5e:2x4"``.
      slices: how many slices of ``topology`` (data parallel across them).
    """

    platform: str
    topology: str
    slices: int = 1

    @property
    def name(self) -> str:
        """The target as written: ``tpu:v5e:2x4`` (``x2`` slices appended when more than one)."""
        return f"{self.platform}:{self.topology}" + (f" x{self.slices} slices" if self.slices > 1 else "")

    @property
    def chips_per_slice(self) -> int:
        """Devices in one slice (one per chip on v5e/v6e, one per megacore chip on v4/v5p)."""
        return len(self.devices()) // self.slices

    def devices(self) -> list[jax.Device]:
        """The target's compile-only devices, every slice's, in jax's order (cached per process)."""
        return list(_topology(self.platform, self.topology, self.slices).devices)

    def __str__(self) -> str:
        return self.name


def parse_target(target: "str | Target", slices: int = 1) -> Target:
    """``"tpu:v5e:2x4"`` (or ``"v5e:2x4"``) as a :class:`Target` of ``slices`` slices.

    Raises:
      TargetError: the name is not ``[tpu:]<generation>:<AxBxC>``, or ``slices`` < 1.
    """
    if isinstance(target, Target):
        return target if slices == 1 else dataclasses.replace(target, slices=slices)
    if not isinstance(slices, int) or slices < 1:
        raise TargetError(str(target), f"slices must be a positive integer, got {slices!r}")
    parts = str(target).strip().split(":")
    if parts and parts[0].lower() == "tpu":
        parts = parts[1:]
    if len(parts) != 2 or not parts[0] or not all(p.isdigit() and int(p) > 0 for p in parts[1].split("x")):
        raise TargetError(
            str(target),
            "a target is a TPU topology as jax spells it, e.g. 'tpu:v5e:2x4', 'tpu:v5p:2x2x2' "
            "(see onnx2jax targets)",
        )
    return Target("tpu", f"{parts[0].lower()}:{parts[1]}", slices)


def list_targets() -> list[str]:
    """Every target :data:`KNOWN_TOPOLOGIES` names, spelled for ``--target``."""
    return [f"tpu:{generation}:{shape}" for generation, shapes in KNOWN_TOPOLOGIES.items() for shape in shapes]


def libtpu_available() -> bool:
    """Whether the libtpu wheel (the TPU compiler) is installed."""
    import importlib.util

    return importlib.util.find_spec("libtpu") is not None


@functools.lru_cache(maxsize=None)
def _topology(platform: str, topology: str, slices: int):
    """jax's TopologyDescription for ``topology`` (``num_slices`` of them), looked up once per process."""
    if not libtpu_available():
        raise TargetError(f"{platform}:{topology}", f"libtpu is not installed; {INSTALL_HINT}")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    prefer_cpu_without_accelerator()  # compile-only devices need no TPU backend
    quiet = not accelerator_visible()  # no TPU here: libtpu's words about the missing host say nothing
    from jax.experimental import topologies

    with _stderr_kept(quiet) as said:
        try:
            return topologies.get_topology_desc(topology, platform=platform, num_slices=slices)
        except Exception as error:  # jax raises RuntimeError/ValueError/XlaRuntimeError for an unknown topology
            failure = error
    detail = f"; libtpu said: {said[0].strip()[-2000:]}" if said and said[0].strip() else ""
    raise TargetError(f"{platform}:{topology}", f"libtpu does not know this topology: {failure}{detail}") from failure


@contextlib.contextmanager
def _stderr_kept(keep: bool) -> Iterator[list[str]]:
    """With ``keep``, what the process writes to its stderr (file descriptor 2) inside is held back, not shown.

    libtpu, started on a machine with no TPU, prints its own warnings about the missing host (accelerator type,
    worker hostnames) while it loads, from C++; they say nothing about compiling for a topology. They are kept
    and shown with the error only when the lookup fails.
    """
    said: list[str] = []
    if not keep:
        yield said
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            yield said
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            said.append(held.read().decode(errors="replace"))


def target_mesh(target: Target, axis_names: Sequence[str], axis_sizes: Sequence[int], data_axis: str | None) -> Mesh:
    """A mesh of ``target``'s devices with these axes; multi-slice: ``data_axis`` split across slices.

    One slice: jax's ``mesh_utils.create_device_mesh`` (the physical torus order). Several:
    ``create_hybrid_device_mesh``, ``data_axis`` taking ``slices`` ways across slices (DCN) and the
    rest within a slice (ICI).

    Raises:
      TargetError: the axes' sizes do not multiply to the target's device count, or with several
        slices no axis ``data_axis`` divides by the slice count.
    """
    from jax.experimental import mesh_utils

    devices = target.devices()
    if math.prod(axis_sizes) != len(devices):
        raise TargetError(
            target.name, f"the plan's mesh {dict(zip(axis_names, axis_sizes))} has {math.prod(axis_sizes)} devices, "
            f"the target {len(devices)}",
        )
    if target.slices == 1:
        try:
            array = mesh_utils.create_device_mesh(tuple(axis_sizes), devices)
        except NotImplementedError:  # an axis no product of the torus's axes makes (8 on a 4x4x4): split one
            array = mesh_utils.create_device_mesh(tuple(axis_sizes), devices, allow_split_physical_axes=True)
        return Mesh(array, tuple(axis_names))
    if data_axis not in axis_names or axis_sizes[list(axis_names).index(data_axis)] % target.slices:
        raise TargetError(
            target.name,
            f"{target.slices} slices need a data axis that divides by {target.slices}; the plan's mesh is "
            f"{dict(zip(axis_names, axis_sizes))}",
        )
    position = list(axis_names).index(data_axis)
    ici = list(axis_sizes)
    ici[position] //= target.slices
    dcn = [1] * len(axis_sizes)
    dcn[position] = target.slices
    array = mesh_utils.create_hybrid_device_mesh(ici, dcn, devices, process_is_granule=False)
    return Mesh(np.asarray(array), tuple(axis_names))


def data_axis_of(axis_names: Sequence[str], axis_sizes: Sequence[int], slices: int) -> str | None:
    """The mesh axis that goes across slices: one named ``data``, ``dp`` or ``batch``, else the first (the
    outermost, slowest-varying) axis whose size divides by ``slices``; None with one slice or none fits."""
    if slices == 1:
        return None
    for name in ("data", "dp", "batch"):
        if name in axis_names and axis_sizes[list(axis_names).index(name)] % slices == 0:
            return name
    return next((n for n, size in zip(axis_names, axis_sizes) if size % slices == 0), None)


def has_attached_devices(mesh: Mesh) -> bool:
    """Whether ``mesh``'s devices can run a program (False for compile-only devices of a topology)."""
    return all(getattr(d.client, "runtime_type", "") != "compile_only_runtime" for d in mesh.devices.flat)


def describe_mesh_target(mesh: Mesh) -> str:
    """A name for the hardware of a compile-only mesh: ``"tpu TPU v5 lite x8"``."""
    first = mesh.devices.flat[0]
    return f"{first.platform} {getattr(first, 'device_kind', '?')} x{mesh.devices.size}"


__all__ = [
    "INSTALL_HINT",
    "KNOWN_TOPOLOGIES",
    "Target",
    "describe_mesh_target",
    "data_axis_of",
    "has_attached_devices",
    "libtpu_available",
    "list_targets",
    "parse_target",
    "target_mesh",
]
