"""``onnx2jax.compile(model, devices=N, plan="auto")``: search, write, compile and check (issue 31).

`compile_auto` asks `sharding.auto.auto_plan` for the fastest layout at this
backend's rates (`onnx2jax.runtime.calibration`, measured once per backend and
cached), compiles the annotated winner with the ordinary
`onnx2jax.runtime.compile.compile`, and checks the compiled program against
the prediction at the workload's shapes (`onnx2jax.runtime.auto_check`): the
executable's ``auto_report`` holds the candidates, the winner's predicted and
measured collectives, bytes and parameter bytes per device, and names every
difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import onnx

from onnx2jax.loading import ModelLike, load_model
from onnx2jax.runtime.auto_check import check
from onnx2jax.runtime.calibration import rates as backend_rates
from onnx2jax.runtime.executable import Executable
from sharding.auto import auto_plan
from sharding.auto.search import AutoReport
from sharding.stage_cut import DEFAULT_SEQUENCE, declared_shapes


def example_inputs(model: onnx.ModelProto, batch: int | None, seq: int | None) -> dict[str, np.ndarray]:
    """Zeros of each model input's type at the workload's shapes (what the winner is compiled and checked at)."""
    shapes = declared_shapes(model, batch or 1, seq or DEFAULT_SEQUENCE)
    out = {}
    for value in model.graph.input:
        if value.name in shapes:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
            out[value.name] = np.zeros(shapes[value.name], dtype)
    return out


def compile_auto(
    model: ModelLike,
    devices: int | Mapping[str, int] | Sequence[int],
    compile_fn: Callable[..., Executable],
    *,
    batch: int | None = None,
    seq: int | None = None,
    memory_per_device: int | None = None,
    objective: str = "latency",
    calibrate: bool = True,
    inputs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Executable:
    """The automatic plan of ``model``, compiled by ``compile_fn`` and checked; ``executable.auto_report`` says what.

    Args:
        model: The model (unannotated, or its annotations are replaced by the plan's configuration ``auto``).
        devices: A device count or a mesh shape (`sharding.auto.auto_plan`).
        compile_fn: `onnx2jax.compile` (passed in, so that this module does not import it back).
        batch, seq, memory_per_device, objective: The workload, as `sharding.auto.auto_plan` takes it.
        calibrate: Measure this backend's rates (once; cached) rather than use the defaults.
        inputs: Example inputs to check the compiled program at; default zeros at the workload's shapes.
        options: Passed to ``compile_fn``.
    """
    proto = load_model(model) if not isinstance(model, onnx.ModelProto) else model
    count = devices if isinstance(devices, int) else int(np.prod(list(devices.values()) if isinstance(devices, Mapping)
                                                                 else list(devices)))
    rates = backend_rates(jax.devices()[:count]) if calibrate and 0 < count <= len(jax.devices()) else None
    annotated, report = auto_plan(proto, devices, batch=batch, seq=seq, memory_per_device=memory_per_device,
                                  objective=objective, rates=rates)
    executable = compile_fn(annotated, configuration="auto", **options)
    check(executable, report, inputs if inputs is not None else example_inputs(proto, batch, seq))
    executable.auto_report = report
    return executable


__all__ = ["AutoReport", "compile_auto", "example_inputs"]
