"""``onnx2jax.compile(model, devices=N, plan="auto")``'s planning step: search (and, for a target, re-rank).

:func:`plan_auto` is a step before compiling, not a wrapper around it: it asks
`sharding.auto.auto_plan` for the fastest layout at this backend's rates
(`onnx2jax.runtime.calibration`, measured once per backend and cached) and
returns the annotated model (configuration ``auto``) with its `AutoReport`.
With a TPU ``target`` the best few candidates are compiled for the target and
re-ranked by the TPU compiler's memory and time estimates
(`onnx2jax.runtime.auto_target`), and the re-ranked winner is the model
returned. `onnx2jax.runtime.compile.compile` then compiles that model like any
annotated one and, where the program runs here, checks it against the
prediction at the workload's shapes (`onnx2jax.runtime.auto_check`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import numpy as np
import onnx

from onnx2jax.loading import ModelLike, load_model
from onnx2jax.runtime.calibration import rates as backend_rates
from onnx2jax.runtime.executable import Executable
from onnx2jax.runtime.targets import Target
from sharding.auto import auto_plan
from sharding.auto.search import AutoReport
from sharding.stage_cut import DEFAULT_SEQUENCE, declared_shapes

PLAN_OPTIONS = ("batch", "seq", "memory_per_device", "objective", "calibrate", "top")
"""The workload and search options `plan_auto` takes (``compile(auto=...)`` adds ``inputs``, the check's)."""


def example_inputs(model: onnx.ModelProto, batch: int | None, seq: int | None) -> dict[str, np.ndarray]:
    """Zeros of each model input's type at the workload's shapes (what the winner is compiled and checked at)."""
    shapes = declared_shapes(model, batch or 1, seq or DEFAULT_SEQUENCE)
    out = {}
    for value in model.graph.input:
        if value.name in shapes:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            out[value.name] = np.zeros(shapes[value.name], dtype)
    return out


def plan_auto(
    model: ModelLike,
    devices: int | Mapping[str, int] | Sequence[int] | None,
    *,
    batch: int | None = None,
    seq: int | None = None,
    memory_per_device: int | None = None,
    objective: str = "latency",
    calibrate: bool = True,
    target: Target | None = None,
    top: int | None = None,
    compile_candidate: Callable[[onnx.ModelProto], Executable] | None = None,
) -> tuple[onnx.ModelProto, AutoReport]:
    """The automatic plan of ``model``: the annotated winner (configuration ``auto``) and the report.

    Args:
        model: The model (unannotated, or its annotations are replaced by the plan's configuration ``auto``).
        devices: A device count or a mesh shape (`sharding.auto.auto_plan`); with a ``target``, None means
            the target's chip count.
        batch, seq, memory_per_device, objective: The workload, as `sharding.auto.auto_plan` takes it.
        calibrate: Measure this backend's rates (once; cached) rather than use the defaults (never for a
            target: its chips are not here).
        target: Plan for a TPU target: the best ``top`` candidates are compiled for it and re-ranked by the
            TPU compiler (``report.target`` holds both rankings).
        top: With a target, how many candidates to compile (default
            `onnx2jax.runtime.auto_target.DEFAULT_TOP`).
        compile_candidate: With a target, compiles an annotated candidate for it (``onnx2jax.compile(m,
            configuration="auto", target=target)``; passed in: no runtime module imports the front door).

    Raises:
        ValueError: ``top`` without a target, a target without ``compile_candidate``, or ``devices`` that is
            not the target's chip count.
        sharding.auto.MemoryLimitError: no layout fits ``memory_per_device``; with a target, no compiled
            candidate fits the chip (:class:`onnx2jax.errors.ChipMemoryError`) or the limit given.
    """
    proto = load_model(model) if not isinstance(model, onnx.ModelProto) else model
    if target is None:
        if top is not None:
            raise ValueError("auto={'top': ...} goes with a target (how many candidates to compile for it)")
        if devices is None:
            raise ValueError("plan='auto' needs devices: a count, or a mesh shape {'data': d, 'tensor': t}")
        count = _count(devices)
        rates = backend_rates(jax.devices()[:count]) if calibrate and 0 < count <= len(jax.devices()) else None
        return auto_plan(proto, devices, batch=batch, seq=seq, memory_per_device=memory_per_device,
                         objective=objective, rates=rates)
    from onnx2jax.runtime.auto_target import DEFAULT_TOP, rerank

    if compile_candidate is None:
        raise ValueError(f"plan_auto for {target.name} needs compile_candidate (how a candidate is compiled for it)")
    chips = len(target.devices())
    if devices is None:
        devices = chips
    elif _count(devices) != chips:
        raise ValueError(f"plan='auto' for {target.name}: devices={devices!r} but the target has {chips} chips")
    _, report = auto_plan(proto, devices, batch=batch, seq=seq, memory_per_device=memory_per_device,
                          objective=objective)
    shapes = {k: v.shape for k, v in example_inputs(proto, batch, seq).items()}
    annotated, _ = rerank(report, target, shapes, compile_candidate, top=DEFAULT_TOP if top is None else top,
                          memory_per_device=memory_per_device)
    return annotated, report


def _count(devices: int | Mapping[str, int] | Sequence[int]) -> int:
    if isinstance(devices, int):
        return devices
    return int(np.prod(list(devices.values()) if isinstance(devices, Mapping) else list(devices)))


__all__ = ["AutoReport", "PLAN_OPTIONS", "example_inputs", "plan_auto"]
