"""``--target`` on ``check``, ``explain``, ``annotate --auto`` and ``export``: the model compiled for a TPU
topology that is not attached, at the shapes the command was given, and what the compiled program says.

One helper for every command (:func:`compile_for_target`): the model is compiled with
``onnx2jax.compile(..., target=)`` (no weight read), lowered at concrete input shapes (the model's own
dims, ``--input-shape`` for symbolic ones), compiled by the TPU compiler, and reported
(:meth:`onnx2jax.runtime.spmd.Compiled.report`): collectives by kind and parameter bytes per chip.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from onnx2jax.cli.errors import UsageError

if TYPE_CHECKING:
    from onnx2jax.runtime.targets import Target


def input_shapes(model: Any, given: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Every runtime input's concrete shape: ``given`` (``--input-shape``) where named, else the model's dims.

    Raises:
      UsageError: an input with a symbolic dim that ``given`` does not size, or one whose values set shapes
        (it cannot be lowered from a shape alone), naming it.
    """
    shapes = {}
    for info in model.inputs:
        if info.name in model.shape_input_names:
            raise UsageError(f"--target: input {info.name!r} sets shapes by its values; it cannot be compiled "
                             "from shapes alone (use onnx2jax.compile(..., target=) with its value)")
        if info.name in given:
            shapes[info.name] = tuple(int(d) for d in given[info.name])
            continue
        dims = info.shape or ()
        if info.shape is None or not all(isinstance(d, int) and d > 0 for d in dims):
            raise UsageError(
                f"--target compiles at concrete shapes: input {info.name!r} has dims {list(dims)}; give them "
                f"with --input-shape {info.name}=" + ",".join("1" for _ in dims)
            )
        shapes[info.name] = tuple(dims)
    return shapes


def compile_for_target(
    model: Any, target: "Target", configuration: str | None, given: Mapping[str, Sequence[int]],
) -> dict[str, Any]:
    """``model`` (a path: its external weights are never opened; or a ModelProto) compiled for ``target``.

    Returns:
      A JSON-able summary: ``target``, ``mesh``, ``shapes``, ``collectives`` (by kind, non-zero),
      ``param_bytes_per_chip`` (the most any chip holds), and ``lines`` to print.
    """
    import onnx2jax

    executable = onnx2jax.compile(model, configuration=configuration, target=target)
    shapes = input_shapes(executable.model, given)
    report = executable.report(**shapes)
    collectives = {kind: n for kind, n in report.collectives.items() if n}
    per_chip = max(report.param_bytes_per_device.values(), default=0)
    where = ", ".join(f"{k} {list(v)}" for k, v in shapes.items())
    counted = ", ".join(f"{kind} {n}" for kind, n in collectives.items()) or "no collective"
    lines = [
        f"compiled for {target.name} (mesh {dict(executable.mesh.shape)}) at {where}: {counted}; "
        f"parameters {per_chip:,} bytes per chip",
    ]
    tpu = report.tpu
    if tpu is not None:  # the TPU compiler's own figures (onnx2jax.runtime.tpu_report)
        lines += tpu.headline()
    return {
        "target": target.name,
        "mesh": dict(executable.mesh.shape),
        "shapes": {k: list(v) for k, v in shapes.items()},
        "collectives": collectives,
        "param_bytes_per_chip": per_chip,
        **({} if tpu is None else {
            "peak_bytes_per_chip": tpu.memory.peak_bytes,
            "hbm_bytes_per_chip": tpu.memory.hbm_bytes,
            "fits": tpu.memory.fits,
            "ici_bytes_per_chip": tpu.network_bytes("ICI"),
            "dcn_bytes_per_chip": tpu.network_bytes("DCN"),
            "estimated_seconds": tpu.cost.seconds,
            "roofline_seconds": tpu.cost.roofline_seconds,
        }),
        "lines": lines,
        "report": tpu,
    }


__all__ = ["compile_for_target", "input_shapes"]
