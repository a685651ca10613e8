"""``onnx2jax annotate --auto`` and ``explain --auto``: the automatic plan (`sharding.auto.auto_plan`) from the command line.

Examples::

    onnx2jax annotate model.onnx --auto --devices 8 -o out.onnx
    onnx2jax annotate model.onnx --auto --devices 8 --batch 16 --seq 512 --memory 16GB --objective train -o out.onnx
    onnx2jax explain model.onnx --auto --devices 8 --batch 16     # the same search and report, nothing written
    onnx2jax explain model.onnx --auto --target tpu:v5e:2x4 --batch 2 --seq 16 --top 3   # re-ranked for the TPU

The devices are asked for as every ``--devices`` command asks (`onnx2jax.cli.options.request_devices`:
fake CPU devices on a machine without accelerators). The search runs at this backend's rates when JAX
sees the devices (measured once and cached: `onnx2jax.runtime.calibration`), else at the defaults; the winner is then compiled on those devices
and its collectives compared with the prediction. The report (top candidates, predicted and measured
cost, any difference) is printed as notes. With ``--target`` the search is for the target's chips at the
default rates, and the cost model's best ``--top`` candidates are compiled for the target and re-ranked
by the TPU compiler's peak memory and time estimate (`onnx2jax.runtime.auto_target`); the report ends
with both rankings in one table.
"""

from __future__ import annotations

import argparse
import functools

import numpy as np
import onnx

from onnx2jax.cli.errors import UsageError
from onnx2jax.cli.options import byte_count, request_devices, target_of
from sharding.auto import AutoPlanError, AutoReport, auto_plan
from sharding.auto.cost import OBJECTIVES


def add_arguments(parser: argparse.ArgumentParser, *, devices: bool = False) -> None:
    """Adds ``--auto`` and the workload options (and ``--devices N`` where ``devices``: annotate has its own)."""
    parser.add_argument("--auto", action="store_true",
                        help="search the fastest layout for --devices (docs/auto-plans.md); configuration 'auto'")
    if devices:
        parser.add_argument("--devices", type=int, metavar="N", help="--auto: the device count to plan for")
    parser.add_argument("--batch", type=int, metavar="B", help="--auto: the batch a call runs with")
    parser.add_argument("--seq", type=int, metavar="S", help="--auto: the sequence length (other symbolic dims)")
    parser.add_argument("--memory", type=byte_count, metavar="SIZE",
                        help="--auto: bytes a device may hold, e.g. 16GB (default: the hand plan's)")
    parser.add_argument("--objective", choices=OBJECTIVES, default="latency", help="--auto: what to minimise")
    parser.add_argument("--mesh-shape", metavar="DxT", help="--auto: only this data x tensor shape, e.g. 2x4")
    parser.add_argument("--top", type=int, metavar="K",
                        help="--auto --target: how many of the cost model's best candidates to compile for the "
                             "target and re-rank by the TPU compiler (default 3)")


def require_auto(args: argparse.Namespace, *, devices: bool = False, target: bool = False) -> None:
    """Refuses the workload options (and ``--devices`` where ``devices``, ``--target`` where ``target``) without
    ``--auto``: nothing would read them."""
    given = [option for option, value in (("--batch", args.batch), ("--seq", args.seq), ("--memory", args.memory),
                                          ("--mesh-shape", args.mesh_shape), ("--devices", devices and args.devices),
                                          ("--objective", args.objective != "latency"),
                                          ("--top", getattr(args, "top", None) is not None)) if value]
    if target and getattr(args, "target", None) is not None:
        given.append("--target")
    if given and not args.auto:
        raise UsageError(f"{', '.join(given)} go with --auto (the automatic plan's workload)")


def _mesh(args: argparse.Namespace) -> int | tuple[int, int]:
    if args.devices is None:
        raise UsageError("--auto needs --devices N")
    if args.mesh_shape is None:
        return args.devices
    parts = args.mesh_shape.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise UsageError(f"--mesh-shape expects DATAxTENSOR such as 2x4, got {args.mesh_shape!r}")
    data, tensor = int(parts[0]), int(parts[1])
    if data * tensor != args.devices:
        raise UsageError(f"--mesh-shape {args.mesh_shape} has {data * tensor} devices, --devices says {args.devices}")
    return data, tensor


def search(args: argparse.Namespace, model: onnx.ModelProto) -> tuple[onnx.ModelProto, AutoReport, list[str]]:
    """The automatic plan of ``model`` for ``args``, its report (the winner compiled and checked where JAX
    sees the devices), and notes on what was not done.

    Raises:
        UsageError: missing --devices, or a bad --mesh-shape; (as `sharding.auto.AutoPlanError`) a
            request no layout meets.
    """
    import jax

    from onnx2jax.runtime.auto_check import check
    from onnx2jax.runtime.auto_compile import example_inputs, plan_auto
    from onnx2jax.runtime.calibration import rates
    from onnx2jax.runtime.compile import compile as compile_model

    target = target_of(args)
    if getattr(args, "top", None) is not None and target is None:
        raise UsageError("--top goes with --target (how many candidates to compile for it)")
    if target is not None:  # the plan is for the target's chips; the best few are compiled for it, not here
        count = len(target.devices())
        if args.devices is None:
            args.devices = count
        elif args.devices != count:
            raise UsageError(f"--devices {args.devices} but --target {target.name} has {count} devices")
    devices = _mesh(args)
    if args.devices < 1:
        raise UsageError(f"--devices must be >= 1, got {args.devices}")
    # fake CPU devices where the machine has no accelerator; none for a target (its chips are not here)
    seen = len(jax.devices()) if target is not None else len(request_devices(args.devices))
    here = seen >= args.devices and target is None
    try:
        if target is not None:  # the cost model's best --top compiled for the target, re-ranked by its compiler
            annotated, report = plan_auto(model, devices, batch=args.batch, seq=args.seq,
                                          memory_per_device=args.memory, objective=args.objective, target=target,
                                          top=args.top, compile_candidate=functools.partial(
                                              compile_model, configuration="auto", target=target))
        else:
            annotated, report = auto_plan(model, devices, batch=args.batch, seq=args.seq,
                                          memory_per_device=args.memory, objective=args.objective,
                                          rates=rates(jax.devices()[:args.devices]) if here else None)
    except AutoPlanError as e:
        raise UsageError(str(e)) from None
    except ValueError as e:  # --top < 1
        raise UsageError(str(e)) from None
    notes = []
    external = any(i.data_location == onnx.TensorProto.EXTERNAL for i in model.graph.initializer)
    if here and external:
        notes.append("the weights are in external data: the winner was not compiled here; compile the annotated "
                     "model with onnx2jax.compile(..., configuration='auto') to check it")
    elif here:
        executable = compile_model(annotated, configuration="auto")
        check(executable, report, example_inputs(annotated, args.batch, args.seq))
    elif target is not None:
        from onnx2jax.cli.target import compile_for_target

        shapes = {k: np.shape(v) for k, v in example_inputs(annotated, args.batch, args.seq).items()}
        notes.extend(compile_for_target(annotated, target, "auto", shapes)["lines"])
    else:
        notes.append(f"JAX sees {seen} devices, not {args.devices}: the rates are the defaults and the winner "
                     "was not compiled (run where the devices are visible to check it)")
    return annotated, report, notes


def annotate_auto(args: argparse.Namespace, model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The automatic plan of ``model`` and the report's lines (as notes); raises as `search` does."""
    annotated, report, notes = search(args, model)
    return annotated, notes + report.lines()
