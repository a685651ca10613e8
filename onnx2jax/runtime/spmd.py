"""One SPMD program: a model (or a stage, or a segment) run through XLA's SPMD partitioner.

:class:`Compiled` takes the translated model and its
:class:`~onnx2jax.runtime.plan.ProgramPlan` (inference, mesh and placements,
made once by :mod:`onnx2jax.runtime.plan`), and then:

1. places the initializers sharded, each device receiving only its slice, once
   per distinct layout their consumers ask for (:mod:`onnx2jax.runtime.parameters`);
2. per input shape signature of a call: takes the plan's inference at those
   concrete shapes (:meth:`ProgramPlan.at_shapes`), traces the graph with
   ``with_sharding_constraint`` on every node input and output that has a
   spec, and jits it; XLA inserts the collectives.

:func:`translate_for` translates a program's model for its plan (the plan
decides whether the layers run as a scan); :class:`Compiled` never changes
the model it is given.

Where values live on the mesh (spec layouts, placements, the inputs' and
outputs' shardings) is :mod:`onnx2jax.runtime.placements`; what ``report()``
measures is :mod:`onnx2jax.runtime.report`; the front door that plans and
picks this or another strategy is :mod:`onnx2jax.runtime.compile`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
from typing import Any, Callable, Hashable, Iterable, Mapping, Sequence

import jax
import numpy as np
import onnx

from onnx2jax import symbolic
from onnx2jax.errors import NoDevicesError, NodeError
from onnx2jax.numerics import on_platform
from onnx2jax.x64 import x64_scope
from onnx2jax.runtime.constraints import ShardingHooks
from onnx2jax.runtime.param_layouts import held_tree, logical_tree
from onnx2jax.runtime.placement_keys import SpecKey, TensorPlacement
from onnx2jax.call_keys import call_key
from onnx2jax.runtime.fast_call import FastCall, moved_inputs
from onnx2jax.runtime.in_flight import InFlight
from onnx2jax.runtime.parameters import ParameterStore
from onnx2jax.runtime.placed_parameters import PlacedParameters
from onnx2jax.runtime.placements import (
    abstract_on_mesh,
    input_placements,
    input_sharding,
    output_placements,
    output_shardings,
    place_on_mesh,
)
from onnx2jax.runtime.plan import ProgramPlan
from onnx2jax.runtime.collective_sources import differences
from onnx2jax.runtime.report import Report, count_collectives, example_inputs, loop_note, node_rows, param_bytes_per_device
from onnx2jax.runtime.scan_sharded import layer_specs_differ, stacked_shardings
from onnx2jax.runtime.targets import describe_mesh_target, has_attached_devices
from onnx2jax.runtime.sizes_at_call import SizesAtCall
from onnx2jax.runtime.training import full_params, initializer_values, trainable_keys, write_onnx
from onnx2jax.runtime.user_mesh import auto_input, tracing
from onnx2jax.xla_options import compiler_options
from onnx2jax.scan import per_layer_names
from onnx2jax.trainable import checked_names
from onnx2jax.runtime.value_and_grad import ValueAndGrad
from onnx2jax.translate import JaxModel
from sharding.inference import Inference


@dataclasses.dataclass(frozen=True)
class _Signature:
    """What depends on one call's input shapes: inference, specs on the mesh, output placements."""

    inference: Inference | None
    placements: dict[SpecKey, TensorPlacement]
    out_placements: tuple  # per graph output, its producer's placement or None
    in_placements: dict[str, TensorPlacement]  # per graph input, its first annotated reader's placement


def translate_for(program: ProgramPlan, external_dir: str | None, **options: Any) -> JaxModel:
    """``program``'s model translated to run under its plan: the one place a plan decides the layer scan.

    A ``lax.scan`` runs every layer with the first layer's specs: when the
    plan's placements give the layers different specs, the layers run
    unrolled and the model's report says why
    (:func:`~onnx2jax.runtime.scan_sharded.layer_specs_differ`). ``options``
    are :class:`~onnx2jax.translate.JaxModel`'s (``scan_layers``,
    ``inferred``, ``check_indices``).

    Raises:
      NodeError: ``scan_layers=True`` and the plan's specs differ between layers.
    """
    model = JaxModel(program.proto, external_dir, **options)
    if model.scan.active:
        why = layer_specs_differ(model.proto, model.scan, program.placements, model.params)
        if why:
            model.unscan(why)
    return model


class Compiled(PlacedParameters):
    """A model compiled for a mesh. Call it like the model; see :func:`onnx2jax.compile`.

    An :class:`~onnx2jax.runtime.executable.Executable`: ``apply`` is the same
    program as a pure function of the parameters.

    Inference runs again with the concrete shapes of each call's shape
    signature (a Reshape ``[B,H,S,D] -> [B*H,S,D]`` keeps its head split only
    when B is known), and the program is specialised per signature; the mesh
    and the parameters are fixed at compile time.

    Attributes:
      model: the translated :class:`~onnx2jax.translate.JaxModel`.
      plan: its :class:`~onnx2jax.runtime.plan.ProgramPlan` (inference, mesh,
        placements; inference at each call's shapes, once per signature).
      mesh: the jax Mesh every sharding lives on.
      inference: the completed annotations at the model's own (possibly
        symbolic) shapes (None for an unannotated model).
      params: the initializers as jax.Arrays, placed with the sharding of
        their first annotated consumer. A parameter with a fused-axis spec is
        held in its unfused shape (for example a [H, 2F] gate/up weight as
        [H, 2, F]); one whose sharded axes do not divide evenly is held
        zero-padded. ``logical_params`` gives the ONNX shapes back; ``logical``
        and ``held`` move any tree keyed by parameter name (gradients,
        optimizer state, a checkpoint) between the two.
      param_copies: further copies of parameters whose consumers want other
        layouts (``"name#k"``), so that no call reshards a constant.
      trainable: the keys of ``params`` to train (:mod:`onnx2jax.trainable`);
        ``with_trainable`` chooses others, ``to_onnx`` writes trained values back.
    """

    def __init__(self, model: JaxModel, plan: ProgramPlan):
        """Places ``model``'s parameters as ``plan`` says; ``model`` is kept as given, never changed.

        Raises:
          ValueError: ``model`` runs its layers as a scan whose layers ``plan`` gives different specs
            (:func:`translate_for` makes the model for a plan).
        """
        self.model = model
        self.plan = plan
        self.mesh = plan.mesh
        self._in_flight = InFlight(self.mesh.devices.flat)  # XLA CPU's rendezvous: see runtime/in_flight.py
        self.inference = plan.inference
        self.configuration = plan.configuration
        placements = plan.placements
        params: Mapping[str, np.ndarray] = model.params
        if model.scan.active:  # the plan decides the scan (translate_for); this program keeps what it is given
            why = layer_specs_differ(model.proto, model.scan, placements, model.params)
            if why:
                raise ValueError(
                    f"the model runs its layers as one lax.scan, which this plan cannot keep: {why}; translate it "
                    "for its plan (onnx2jax.runtime.spmd.translate_for, which unrolls them) or with scan_layers=False"
                )
            scanned = per_layer_names(model.scan)  # each layer's parameters live only in the stacked copies
            params = {k: v for k, v in model.params.items() if k not in scanned}
        # layouts only: no value is read
        self._store = ParameterStore(self.mesh, params, placements, _readers(model.proto.graph, params))
        self._host_params = params
        self._stacked_shardings = (
            stacked_shardings(model.proto, model.scan, placements, self.mesh) if model.scan.active else {}
        )
        self._placed: dict[str, dict[str, jax.Array]] = {}  # PlacedParameters.place fills it
        self.target: str | None = None if has_attached_devices(self.mesh) else describe_mesh_target(self.mesh)
        self._signatures: dict[tuple, _Signature] = {}
        self._jitted: dict[tuple, Any] = {}
        self._last_args: tuple | None = None
        self._fast_calls: dict[Hashable, FastCall] = {}  # per call_key: the compiled short path
        # dim_values written on symbolic axes are checked against each call's shapes (fused
        # axes are checked as they are laid out per call, in spec_layouts).
        self._sizes = SizesAtCall(plan.proto, plan.structural)
        self._trainable: tuple[str, ...] | None = None

    # -- parameters -------------------------------------------------------

    def _logical_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return {name: self._store.logical(name, value) for name, value in params.items()}

    @property
    def stored_params(self) -> dict[str, jax.Array]:
        """Every array placed for the parameters: ``params`` and ``param_copies`` together."""
        return {**self.params, **self.param_copies}

    @property
    def logical_params(self) -> dict[str, jax.Array]:
        """The parameters in their ONNX shapes (fused views folded, padding removed)."""
        return self._logical_params(self.params)

    def logical(self, tree: Any) -> Any:
        """``tree`` with every leaf held in a stored layout folded to its ONNX initializer's shape.

        ``tree``: parameters, gradients or optimizer state (optax's, keyed by
        parameter name like ``params``), laid out as :attr:`params`; the result is
        the same on every mesh (:mod:`onnx2jax.runtime.param_layouts`), so it is
        what a portable checkpoint holds. ``logical(params)`` equals
        :attr:`logical_params`; :meth:`held` is the inverse.
        """
        return logical_tree(self._store, self.params, tree)

    def held(self, tree: Any) -> Any:
        """``tree`` at the ONNX initializers' shapes laid out (unfused, padded) and placed as :attr:`params` holds it.

        The inverse of :meth:`logical`: what this program's ``apply``, an
        optimizer over its ``params`` or :meth:`to_onnx` take. Values may come
        from another mesh or the host.
        """
        return held_tree(self._store, self.params, tree)

    @property
    def trainable(self) -> tuple[str, ...]:
        """The keys of :attr:`params` to train: :mod:`onnx2jax.trainable`'s rule, or :meth:`with_trainable`'s names."""
        if self._trainable is None:
            self._trainable = trainable_keys(self)
        return self._trainable

    def with_trainable(self, names: Iterable[str]) -> "Compiled":
        """This compiled program (programs, parameters and caches shared) with ``names`` as :attr:`trainable`.

        Raises:
          ParameterError (a KeyError): a name is not a key of :attr:`params`, naming it.
        """
        other = copy.copy(self)
        other._trainable = checked_names(names, self.params, "with_trainable")
        return other

    def to_onnx(
        self, params: Mapping[str, Any] | None = None, path: str | os.PathLike | None = None, *,
        external_data: bool | None = None,
    ) -> onnx.ModelProto:
        """The model with ``params`` (some or all, laid out as :attr:`params`) as its initializers; saved at ``path``.

        Annotations are kept; see :func:`onnx2jax.runtime.training.write_onnx` for ``external_data``.
        """
        values = initializer_values(self, self.params if params is None else params)
        return write_onnx(self.plan.proto, values, path, external_data=external_data)

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> ValueAndGrad:
        """``(params, *inputs, loss_args=(), **named) -> (loss, grads)``: jitted ``jax.value_and_grad`` over :meth:`apply`.

        ``params``: the parameters to differentiate (a subset of :attr:`params`,
        laid out alike); the others are this program's own. The loss is
        ``loss_fn(outputs, *loss_args)`` with the outputs in ONNX order; the
        gradients come back placed like their parameters; a name that is not
        a parameter is a ``ParameterError``. The same face as
        :meth:`onnx2jax.runtime.pipeline.PipelineCompiled.value_and_grad`. Its ``lower(params, *inputs,
        loss_args=...)`` lowers the program over :attr:`abstract_params` (a target's too:
        :class:`~onnx2jax.runtime.value_and_grad.ValueAndGrad`).
        """
        return ValueAndGrad(self, loss_fn)

    # -- per shape signature ----------------------------------------------

    def _signature(self, key: tuple, input_shapes: Mapping[str, tuple[int, ...]]) -> _Signature:
        """Inference, placements and output shardings for one input shape signature (cached)."""
        found = self._signatures.get(key)
        if found is not None:
            return found
        if self.inference is None:
            found = _Signature(None, {}, (None,) * len(self.model.output_names), {})
        else:
            proto = self.plan.proto
            self._sizes.check(input_shapes)
            inference, placements = self.plan.at_shapes(input_shapes)
            found = _Signature(
                inference, placements, output_placements(proto, placements), input_placements(proto, placements)
            )
        self._signatures[key] = found
        return found

    # -- tracing ----------------------------------------------------------

    def _evaluate(
        self, signature: _Signature, params: Mapping[str, Any], copies: Mapping[str, Any] | None, inputs: Mapping[str, Any]
    ) -> tuple:
        """Traces the graph with the signature's constraints over stored ``params`` (:func:`_trace`)."""
        return _trace(self._store, self.model, self.plan, signature, params, copies, inputs)

    def _program(self, inputs: Sequence[Any], named: Mapping[str, Any], *, abstract: bool = False):
        """The jitted program for these inputs and its runtime arguments (``abstract``: ShapeDtypeStructs with
        their shardings instead of placed parameters and inputs: lowering without data, on any mesh).

        Inputs that set shapes are folded in as constants (one program per
        value). An output whose spec JAX cannot hold (uneven, or fused) comes
        back split on another axis its mesh axes divide, or replicated where
        none does (``placements.holdable_output``), with a warning, once per
        input signature.
        """
        placed, static, key, shapes, signature = self._prepare(inputs, named, abstract=abstract)
        stored = (self.abstract_params, self.abstract_param_copies) if abstract else (self.params, self.param_copies)
        args = (stored, placed)
        jitted = self._jitted.get((key, shapes))
        if jitted is None:
            store, model, plan = self._store, self.model, self.plan  # not self: no cycle (_trace)
            evaluate = lambda stored, values: _trace(  # noqa: E731
                store, model, plan, signature, *stored, {**values, **static})
            # Output shapes matter only to outputs with a spec: without one (an unannotated model) the graph is
            # not traced twice (eval_shape, then jit: 70 ms of GPT-2's first result).
            wanted = signature.out_placements
            avals = jax.eval_shape(evaluate, *args) if any(p is not None for p in wanted) else (None,) * len(wanted)
            out_shardings = output_shardings(self.mesh, self.model.output_names, wanted, avals)
            options = compiler_options(self.mesh.devices.flat[0].platform)
            jitted = self._jitted[(key, shapes)] = jax.jit(evaluate, out_shardings=out_shardings, compiler_options=options)
        return jitted, args, signature

    def _prepare(self, inputs: Sequence[Any], named: Mapping[str, Any], *, abstract: bool = False):
        """Binds a call's inputs: (runtime inputs placed on the mesh, shape-setting ones, their key, shapes, signature).

        ``abstract``: the runtime inputs as ShapeDtypeStructs with their shardings instead (nothing placed).
        """
        dynamic, static, key = self.model.split_static(self.model.bind_inputs(inputs, named))
        dynamic = {k: auto_input(v) for k, v in dynamic.items()}
        shapes = tuple((k, np.shape(v)) for k, v in sorted(dynamic.items()))
        input_shapes = {k: symbolic.named_shape(np.shape(v)) for k, v in {**dynamic, **static}.items()}
        signature = self._signature((key, shapes), input_shapes)
        if abstract:
            return abstract_on_mesh(dynamic, signature.in_placements, self.mesh), static, key, shapes, signature
        if self.target is not None and not all(isinstance(v, jax.core.Tracer) for v in dynamic.values()):
            raise NoDevicesError(self.target, "run")
        return place_on_mesh(dynamic, signature.in_placements, self.mesh), static, key, shapes, signature

    def place_inputs(self, **named: Any) -> dict[str, Any]:
        """The named inputs as a call places them (``placements.place_on_mesh``); shape-setting ones stay numpy.

        A segmented run (:mod:`onnx2jax.runtime.segmented`) places a host step's
        outputs with this before calling, so that it can report where they went.
        """
        with self._scope():
            placed, static, _, _, _ = self._prepare((), named)
        return {**placed, **static}

    def input_shardings(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, jax.sharding.Sharding]:
        """Where a call whose inputs have these ``shapes`` (every runtime input, by name) places each, as
        :meth:`place_inputs` would, without any data: a generation loop makes its cache there directly."""
        key = ((), tuple((k, tuple(v)) for k, v in sorted(shapes.items())))
        with self._scope():
            signature = self._signature(key, {k: tuple(v) for k, v in shapes.items()})
        return {k: input_sharding(tuple(v), signature.in_placements.get(k), self.mesh) for k, v in shapes.items()}

    def apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The model as a pure function of its parameters: ``apply(compiled.params, x) == compiled(x)``.

        Traceable and differentiable: ``jax.jit(compiled.apply)`` and
        ``jax.grad`` of a scalar of it run the same sharded program
        (the same constraints on every annotated node input and output, on
        this program's mesh). ``params`` are laid out as :attr:`params` holds
        them (fused views unfused, uneven ones padded); a consumer that reads a
        further copy (:attr:`param_copies`) reads it from ``params`` here,
        resharded inside the program, so that gradients reach ``params`` alone.
        A model with 64-bit tensors needs ``jax.enable_x64`` around the trace
        (``JaxModel.evaluate`` says so otherwise); inputs that set shapes must be concrete.

        ``params`` may hold only some parameters (``compiled.trainable``'s, say): the others are the
        executable's own. A name it does not have or a value of another shape is a ``ParameterError``
        naming the parameter (:func:`~onnx2jax.runtime.training.full_params`). Concrete token ids are
        checked as a call checks them (``InputRangeError``); under ``jax.jit`` they are tracers, and
        :meth:`checked_apply` checks them on device.
        """
        params = full_params(self, params)
        self.model.index_check.call(inputs, named)  # skips tracers: see checked_apply
        with tracing(self.mesh):
            placed, static, _, _, signature = self._prepare(inputs, named)
            return self._evaluate(signature, params, None, {**placed, **static})

    def checked_apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """:meth:`apply` with the token-id check on device, for use under ``jax.jit``: ``(error, outputs)``.

        ``error`` is a ``jax.experimental.checkify.Error``; ``error.throw()`` raises when an index input
        (a token id, say) was outside its table, naming the input, the node and the table, where
        :meth:`apply` under ``jit`` would compute with clamped or NaN rows::

            error, (logits,) = jax.jit(compiled.checked_apply)(params, ids)
            error.throw()
        """
        from jax.experimental import checkify

        from onnx2jax.runtime.index_checkify import check_on_device

        index_check = self.model.index_check
        if index_check.enabled:
            bound = {**dict(zip(self.model.input_names, inputs)), **named}
            error, _ = checkify.checkify(lambda values: check_on_device(index_check.uses, values))(bound)
        else:
            error, _ = checkify.checkify(lambda: None)()
        return error, self.apply(params, *inputs, **named)

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the sharded program; returns jax.Arrays in ONNX output order.

        A repeated input signature takes the short path of
        :mod:`onnx2jax.runtime.fast_call`: the executable the first such call
        compiled, called directly.
        """
        self.model.index_check.call(inputs, named)  # onnx2jax.input_checks, before the short path too
        self._last_args = (inputs, named)
        key = None if self.model.shape_input_names else call_key(inputs, named)
        fast = self._fast_calls.get(key)
        if fast is not None:
            return self._in_flight.admit(fast(inputs, named))
        with self._scope():
            jitted, args, _ = self._program(inputs, named)
            if key is None:
                return self._in_flight.admit(jitted(*args))
            executable = jitted.lower(*args).compile()  # the same compile: jit and lower() share their cache
            names = tuple(self.model.input_names[: len(inputs)])
            moves = moved_inputs({**dict(zip(names, inputs)), **named}, args[1])
            self._fast_calls[key] = FastCall(executable, args[0], names, moves, self.model.uses_64bit)
            return self._in_flight.admit(executable(*args))

    def _scope(self) -> contextlib.ExitStack:
        """64-bit types for this call only, and this program's mesh whatever mesh the caller set."""
        stack = contextlib.ExitStack()
        stack.enter_context(x64_scope(self.model.uses_64bit))
        stack.enter_context(tracing(self.mesh))
        return stack

    def lower(self, *inputs: Any, **named: Any) -> jax.stages.Lowered:
        """The jax ``Lowered`` program for these inputs (``.as_text()``, ``.compile()``), without placing anything.

        The parameters are lowered as :attr:`abstract_params` (ShapeDtypeStructs with their planned shardings),
        so this works on a mesh of compile-only devices (a TPU target) and reads no weight. Each input may be
        an array, a ``jax.ShapeDtypeStruct`` or, for a runtime input, a tuple of ints (its shape, at the
        model's dtype); inputs that set shapes must be concrete values.
        """
        with self._scope():
            jitted, args, _ = self._program(self._shaped(inputs), self._shaped(named), abstract=True)
            return jitted.lower(*args)

    def _shaped(self, values: Any) -> Any:
        """Runtime inputs given as shapes (tuples of ints) as ShapeDtypeStructs of the input's ONNX dtype."""
        infos = {info.name: info for info in self.model.inputs}

        def shaped(name: str | None, value: Any) -> Any:
            info = infos.get(name)
            if (
                isinstance(value, tuple) and all(isinstance(d, int) for d in value) and info is not None
                and info.dtype is not None and name not in self.model.shape_input_names
            ):
                return jax.ShapeDtypeStruct(value, info.dtype)
            return value

        if isinstance(values, Mapping):
            return {k: shaped(k, v) for k, v in values.items()}
        names = self.model.input_names
        return tuple(shaped(names[i] if i < len(names) else None, v) for i, v in enumerate(values))

    def compiled_text(self, *inputs: Any, **named: Any) -> str:
        """The HLO text of the compiled, partitioned program."""
        return self.lower(*inputs, **named).compile().as_text()

    def report(self, *inputs: Any, **named: Any) -> "Report":
        """Per node specs, collectives of the compiled program and bytes per device.

        Uses the given inputs, else those of the last call.

        Raises:
          ValueError: no inputs given and the model was never called.
        """
        inputs, named = example_inputs(inputs, named, self._last_args)
        on_tpu = self.mesh.devices.flat[0].platform == "tpu"
        with self._scope():
            jitted, args, signature = self._program(self._shaped(inputs), self._shaped(named), abstract=True)
            lowered = jitted.lower(*args)
            if on_tpu:  # the TPU compiler's figures: peak per chip against HBM, ICI and DCN, its time estimate
                from onnx2jax.runtime.tpu_report import compile_and_report

                compiled, tpu = compile_and_report(lowered, self.mesh, what=self.target or "the program")
            else:
                compiled, tpu = lowered.compile(), None
        text = compiled.as_text()
        memory = compiled.memory_analysis()
        return Report(
            mesh=dict(self.mesh.shape),
            configuration=self.configuration,
            collectives=count_collectives(text),
            param_bytes_per_device=param_bytes_per_device({**self.abstract_params, **self.abstract_param_copies}),
            param_bytes_total=sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in self.model.params.values()),
            temp_bytes=None if on_tpu else getattr(memory, "temp_size_in_bytes", None),  # 0 on a TPU: see tpu
            node_specs=node_rows(signature.inference, signature.placements),
            notes=self._notes() + loop_note(self.model, text)
            + ([] if self.model.scan.active else differences(text, signature.inference)),
            tpu=tpu,
        )

    def _notes(self) -> list[str]:
        notes = [self.model.layers_report()]
        if self.plan.mapping is not None:
            for key, extra in self.plan.mapping.partial.items():
                notes.append(
                    f"{key}: the spec names only some devices; inside one SPMD "
                    f"program devices {sorted(extra)} hold replicas"
                )
        return notes + self._store.notes()


def _readers(graph: onnx.GraphProto, params: Mapping[str, Any]) -> dict[str, list[SpecKey]]:
    """By parameter, every input of a node of ``graph`` that reads it (ParameterStore's readers)."""
    readers: dict[str, list[SpecKey]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name in params:
                readers.setdefault(name, []).append(SpecKey(node.name, "in", position, name))
    return readers


def _trace(
    store: ParameterStore, model: JaxModel, plan: ProgramPlan, signature: _Signature, params: Mapping[str, Any],
    copies: Mapping[str, Any] | None, inputs: Mapping[str, Any],
) -> tuple:
    """Traces ``model``'s graph with the signature's constraints over stored ``params``.

    ``copies`` are the further stored layouts (``param_copies``); None: each
    consumer of a copy reads its parameter from ``params`` and its constraint
    reshards it inside the program (what :meth:`Compiled.apply` does, so that
    gradients reach ``params`` alone). A function of the program's parts, not
    of the :class:`Compiled`: the jitted programs that close over it hold no
    reference to their executable (no cycle: a dropped one is freed at once).
    """
    views = {}
    for name, value in params.items():
        view = store.view(name, value)
        if view is not None:
            views[name] = view
    consumer_values = {}
    for key, copy in store.consumer_copy.items():
        if copies is None:
            name = copy.rsplit("#", 1)[0]
            consumer_values[key] = store.logical(name, params[name])
            if key not in signature.placements:  # no constraint of its own: read whole, as its stored copy
                consumer_values[key] = jax.lax.with_sharding_constraint(
                    consumer_values[key], store.placements[copy].sharding)
        else:
            consumer_values[key] = store.view(copy, copies[copy]) or store.logical(copy, copies[copy])
    if model.scan.active and signature.placements is not plan.placements:
        why = layer_specs_differ(model.proto, model.scan, signature.placements, model.params)
        if why:
            raise NodeError(
                f"at these input shapes the layers' specs differ ({why}), but the layers were compiled as one "
                "lax.scan; compile with scan_layers=False"
            )
    logical = {name: store.logical(name, value) for name, value in params.items()}
    hooks = ShardingHooks(signature.placements, views, consumer_values, model.proto.graph, logical)
    with on_platform(plan.mesh.devices.flat[0].platform):  # the products' precision and kernels follow the target
        return model.evaluate(logical, inputs, hooks)
