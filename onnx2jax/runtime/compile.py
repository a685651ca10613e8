"""``onnx2jax.compile(model, mesh)``: plan once, then run by the strategy the plan calls for.

The front door. :func:`onnx2jax.runtime.plan.make_plan` makes the one
analysis (load, shapes, validation, configuration, partition kind, and for a
whole model inference and mesh); the plan's kind picks the strategy:

- ``"whole"``: one SPMD program (:class:`onnx2jax.runtime.spmd.Compiled`);
- ``"stages"``: one program per pipeline stage (:mod:`onnx2jax.runtime.pipeline`);
- ``"segments"``: jitted segments and host steps (:mod:`onnx2jax.runtime.segmented`).

Every strategy returns an :class:`~onnx2jax.runtime.executable.Executable`.
The strategies never import this module.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, Sequence

from jax.sharding import Mesh

from onnx2jax.loading import ModelLike
from onnx2jax.numerics import checked_compute_dtype, checked_precision
from onnx2jax.runtime.executable import Executable
from onnx2jax.runtime.pipeline import compile_pipeline
from onnx2jax.runtime.pipeline_schedules import PipelineSchedule
from onnx2jax.runtime.plan import make_plan
from onnx2jax.runtime.segmented import compile_segmented
from onnx2jax.runtime.spmd import Compiled, translate_for
from onnx2jax.runtime.targets import Target, parse_target
from onnx2jax.scan import ScanSetting


def compile(  # noqa: A001 - the name mirrors jax's compile step on purpose
    model: ModelLike,
    mesh: Mesh | None = None,
    *,
    configuration: str | None = None,
    check: bool = True,
    devices: Sequence[int] | int | None = None,
    microbatches: int = 1,
    schedule: "str | PipelineSchedule | None" = None,
    scan_layers: ScanSetting = "auto",
    check_indices: bool = True,
    plan: str | None = None,
    auto: Mapping[str, Any] | None = None,
    precision: str = "auto",
    compute_dtype: str | None = None,
    target: "str | Target | None" = None,
    slices: int = 1,
) -> Executable:
    """Compiles an annotated ONNX model for a device mesh.

    Args:
      model: a path, bytes or ModelProto carrying sharding annotations (or none:
        then it runs replicated).
      mesh: the jax Mesh to run on, with Explicit or Auto axes (the program
        runs on its devices and axis names with Auto axes: see
        :mod:`onnx2jax.runtime.user_mesh`). When None, the mesh of an enclosing
        ``with jax.set_mesh(mesh):``; outside one, a mesh is built from the
        model's device configuration over ``jax.devices()`` (configuration
        device i is ``jax.devices()[i]``), with axes chosen so that every spec
        is a NamedSharding on it.
      configuration: which DeviceConfigurationProto to use, when there are several.
      check: refuse a model whose annotations break an op's sharding rule
        (``sharding.infer``'s errors). Malformed annotations (axes, sizes,
        devices, configurations, node names, stages: ``sharding.validate``)
        are refused whatever ``check`` says, before anything is traced.
      devices: with a user ``mesh``, the flat mesh position of each configuration
        device (default: row-major, device i at position i).
      microbatches: for a model with pipeline stages (``pipeline_stage``), the
        number of micro-batches a call's batch is split into; such a model
        compiles to a :class:`onnx2jax.runtime.pipeline.PipelineCompiled`
        (GPipe's fill-drain order; ``PipelineCompiled.schedule`` takes another).
      schedule: for pipeline stages, the training schedule of
        ``value_and_grad`` (and the order of a call's forwards): ``"gpipe"``,
        ``"1f1b"``, ``"interleaved-1f1b"``, ``"zero-bubble"`` or a
        :class:`~onnx2jax.runtime.pipeline_schedules.PipelineSchedule`
        (see docs/pipeline-training.md). None: GPipe.
      scan_layers: as :func:`onnx2jax.translate`'s: run the repeated layers
        as one ``lax.scan``, each stacked parameter placed with its first
        layer's spec behind an unsplit layer axis. Layers whose specs differ
        stay unrolled (``report().notes`` says why; ``True`` raises instead).
      check_indices: as :func:`onnx2jax.translate`'s: before each call, refuse
        integer inputs that index a table beyond its size
        (:mod:`onnx2jax.input_checks`); ``False`` skips that host-side check.
      plan: ``"auto"``: search the fastest layout for ``devices`` (a count, or a
        mesh shape ``{"data": d, "tensor": t}``) with :func:`sharding.auto.auto_plan`,
        compile it and check it against the prediction
        (:mod:`onnx2jax.runtime.auto_compile`); the executable's ``auto_report``
        says what was weighed, chosen and measured. ``auto`` holds the
        workload: ``batch``, ``seq``, ``memory_per_device``, ``objective``,
        ``calibrate``, ``inputs``. With a ``target``, the best ``auto["top"]`` candidates (default 3) are
        compiled for it and re-ranked by the TPU compiler's memory and time estimates
        (:mod:`onnx2jax.runtime.auto_target`); the re-ranked winner is compiled for the target and
        ``auto_report.target`` holds both rankings (docs/auto-plans.md).
      precision: the precision of every matrix product (:mod:`onnx2jax.numerics`,
        docs/tpu-numerics.md): ``"auto"`` (the default) keeps ONNX's float32
        fidelity (``HIGHEST``) on CPU and GPU and for float32 products on a TPU,
        and computes bf16 products on a TPU in one MXU pass (``DEFAULT``);
        ``"highest"``, ``"high"`` or ``"default"`` set every product.
      compute_dtype: ``"bfloat16"`` (or ``"float16"``): run a float32 export in
        that dtype, its float32 parameters held in it and its outputs cast back
        to the model's types (:mod:`onnx2jax.numerics`); None: the model's types.
      target: compile for hardware that need not be attached: a TPU topology as jax spells it,
        ``"tpu:v5e:2x4"`` (:mod:`onnx2jax.runtime.targets`; needs libtpu: ``pip install 'jax[tpu]'``). The
        mesh is laid over the target's compile-only devices; the executable's ``lower()``,
        ``lower().compile()`` and ``report()`` work, and running or placing raises
        :class:`~onnx2jax.errors.NoDevicesError`. ``mesh=`` a Mesh of topology devices does the same.
      slices: with ``target``, how many slices of it (data parallel across slices: the data axis of a
        hybrid mesh spans them).

    Returns:
      An :class:`~onnx2jax.runtime.executable.Executable` (``__call__``,
      ``params``, ``apply``, ``lower``, ``report``): a
      :class:`~onnx2jax.runtime.spmd.Compiled`: call it like the model. A model whose output
      shapes depend on run-time values (NonMaxSuppression, NonZero, ...:
      ``onnx2jax.translate(model).segments``) gives a
      :class:`onnx2jax.runtime.segmented.SegmentedCompiled`, which runs each jitted
      segment sharded and the data-dependent nodes on the host between them.

    Raises:
      ValueError: ``precision`` or ``compute_dtype`` is not one of ``onnx2jax.numerics``' choices.
      onnx2jax.errors.ConfigurationError (a ValueError): the configuration asked for is not in the
        model, or the model has several and none was asked for; it names those the model defines.
      sharding.ShardingError: the annotations have errors (each diagnostic
        names the node, tensor and axis); at a call, a size written on a
        symbolic axis that the call's shapes contradict.
      onnx2jax.errors.ModelLoadError: the file cannot be read safely, or the graph has a cycle.
      onnx2jax.errors.MeshMappingError: a spec cannot be a NamedSharding on one mesh.

    Example:
      >>> compiled = onnx2jax.compile("llama_tp8.onnx")          # doctest: +SKIP
      >>> (logits,) = compiled(input_ids)                         # doctest: +SKIP
      >>> compiled.report().render()                              # doctest: +SKIP
    """
    resolved = None if target is None else parse_target(target, slices)
    if resolved is None and slices != 1:
        raise ValueError(f"slices={slices} needs a target")
    if plan is not None:
        return _planned(model, plan, devices, auto, resolved, mesh=mesh, check=check, microbatches=microbatches,
                        scan_layers=scan_layers, check_indices=check_indices, precision=precision,
                        compute_dtype=compute_dtype)
    if auto is not None:
        raise ValueError("compile(auto=...) goes with plan='auto'")
    precision = checked_precision(precision)
    checked_compute_dtype(compute_dtype)  # refused before the model is planned
    plan = make_plan(
        model, mesh, configuration=configuration, check=check, devices=devices, microbatches=microbatches,
        scan_layers=scan_layers, target=resolved,
    )
    plan = dataclasses.replace(plan, precision=precision, compute_dtype=compute_dtype)
    if schedule is not None and plan.kind != "stages":
        raise ValueError(f"schedule={schedule!r} needs a model with pipeline stages; this one has none")
    if plan.kind == "stages":
        executable = compile_pipeline(plan, schedule)
    elif plan.kind == "segments":
        executable = compile_segmented(plan)
    else:
        translated = translate_for(
            plan.program, plan.external_dir, scan_layers=plan.scan_layers, inferred=plan.inferred, precision=plan.precision,
            compute_dtype=plan.compute_dtype, defer_external=not plan.read_weights,
        )
        executable = Compiled(translated, plan.program)
        if resolved is not None:
            executable.target = resolved.name  # the target as the user named it, in NoDevicesError's message
    executable.model.index_check.enabled = check_indices
    return executable


def _planned(model: ModelLike, plan: str, devices: Any, auto: Mapping[str, Any] | None, target: Target | None,
             **options: Any) -> Executable:
    """``compile(model, devices=N, plan="auto")``: the planning step (:func:`plan_auto`), then this compile of
    its annotated winner (for the target, when there is one), then the check against the prediction where
    the program runs here."""
    from onnx2jax.runtime.auto_check import check as check_prediction  # loaded only when asked for
    from onnx2jax.runtime.auto_compile import PLAN_OPTIONS, example_inputs, plan_auto

    if plan != "auto":
        raise ValueError(f"plan must be 'auto' (or None for the model's own annotations), got {plan!r}")
    if devices is not None and not isinstance(devices, (int, Mapping)) and not all(isinstance(d, int) for d in devices):
        raise ValueError("plan='auto' needs devices: a count, or a mesh shape {'data': d, 'tensor': t}")
    workload = dict(auto) if auto else {}
    unknown = sorted(set(workload) - set(PLAN_OPTIONS) - {"inputs"})
    if unknown:
        raise ValueError(f"compile(auto=...) has no option {unknown[0]!r}; "
                         f"the options are {PLAN_OPTIONS + ('inputs',)}")
    inputs = workload.pop("inputs", None)
    if target is not None and inputs is not None:
        raise ValueError(f"auto={{'inputs': ...}} checks a program that runs here; one for {target.name} does not")
    candidate = None if target is None else functools.partial(compile, configuration="auto", target=target)
    annotated, report = plan_auto(model, devices, target=target, compile_candidate=candidate, **workload)
    executable = compile(annotated, configuration="auto", target=target, **options)
    if target is None:
        check_prediction(executable, report, inputs if inputs is not None
                         else example_inputs(annotated, workload.get("batch"), workload.get("seq")))
    executable.auto_report = report
    return executable


__all__ = ["compile"]
