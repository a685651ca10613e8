"""ONNX model -> :class:`JaxModel`, a pure, traceable jax function ``f(params, *inputs)``.

:func:`translate` opens the model and builds a :class:`JaxModel`: it sorts
the initializers into parameters and constants, reads the graph's inputs
(:mod:`onnx2jax.binding`) and checks a call's inputs against them, plans the
layer scan (:mod:`onnx2jax.scan`) and the cuts around data-dependent nodes
(:mod:`sharding.segments`), and jits. Running the graph itself is
:mod:`onnx2jax.graph_runner`'s job. Symbolic dims are specialised from the
actual input shapes: ``jax.jit`` traces once per shape signature and caches
the result.

Initializers become the ``params`` pytree (a dict name -> array), except small
non-float ones (at most ``STATIC_INITIALIZER_LIMIT`` elements: shape vectors,
axes, indices) and any that set a shape (a Resize's float scales), which are
folded as constants so that shape chains stay static.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper

import onnx2jax.scan as _scan
import sharding.segments as _segments
from sharding.shapes import InferredModel, topological_order
from onnx2jax.binding import bind_inputs, input_info
from onnx2jax.branch_step import if_step
from onnx2jax.errors import BranchShapesDiffer, NodeError, PrecisionError, UnsupportedOpError
from onnx2jax.call_keys import call_key
from onnx2jax.graph_runner import (
    GraphRunner,
    Hooks,
    opsets_of,
    shape_setting_inputs,
    subgraphs,
    to_jax,
    unsupported_ops,
    uses_wide_types,
)
from onnx2jax.hostvalues import to_host
from onnx2jax.input_checks import IndexCheck
from onnx2jax.loading import ExternalTensor, ModelLike, drop_pages, host_array, initializer_array, open_model
from onnx2jax.numerics import checked_compute_dtype, checked_precision, compute_scope, narrowed, precision_scope
from onnx2jax.placing import holding
from onnx2jax.xla_options import compiler_options
from onnx2jax.x64 import x64_scope

STATIC_INITIALIZER_LIMIT = 4096
"""Non-float initializers up to this many elements are folded as constants."""

BAKED_PARAMETER_LIMIT = 1
"""Parameters up to this many elements are compile-time constants when the model is called.

Models keep scalars as float initializers: Pow's exponent, attention scales,
epsilons, GELU's coefficients, the mask's fill value. As runtime arguments
XLA cannot simplify around them: ``x ** y`` with an unknown ``y`` compiles to a
general power (exp/log, several times slower than ``x * x * x``) and a scale
broadcast to the attention scores is materialised. ``JaxModel.__call__`` always
runs with ``params`` as loaded, so it bakes these in; ``fn`` still takes them
as arguments, so differentiating or replacing them works as before.
"""


class JaxModel:
    """An ONNX model as a pure jax function.

    ``model.fn(params, *inputs)`` is the traceable function (works under
    ``jax.jit``, ``jax.vmap``, ``jax.grad``); ``model(*inputs)`` runs it jitted
    with 64-bit types enabled for the call only (see :func:`translate`).

    Attributes:
      proto: the loaded, function-inlined ModelProto.
      params: initializers that are parameters, name -> numpy array.
      constants: small non-float initializers folded while tracing.
      inputs: the graph's runtime inputs (not initializers), in order.
      output_names: the graph's outputs, in order.
      uses_64bit: whether the graph has int64/float64 tensors, so that tracing
        needs ``jax.enable_x64``.
      external_dir: where the initializers kept on disk by
        :func:`onnx2jax.loading.open_model` are memory-mapped from.
      shape_input_names: graph inputs whose values set shapes (a Reshape's
        shape fed from outside, directly or through ops that compute on it),
        and string inputs (JAX has no strings): calling the model treats
        them as compile-time constants, compiling once per distinct value.
      segments: where the graph is cut around nodes whose output shapes
        depend on run-time values (:mod:`sharding.segments`): jitted
        segments and host steps in run order, each host step with its
        reason. Empty for a model that runs as one program. A compile
        passes its plan's shape inference (``inferred``), so that cutting and
        typing the segments does not run it again.
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        external_dir: str | None = None,
        *,
        segmentable: bool = True,
        scan_layers: _scan.ScanSetting = "auto",
        inferred: InferredModel | None = None,
        check_indices: bool = True,
        precision: str = "auto",
        compute_dtype: str | None = None,
        defer_external: bool = False,
    ):
        """``defer_external``: external-data weights are held as :class:`~onnx2jax.loading.ExternalTensor`
        (shape and dtype, file not opened) for an ahead-of-time compile; such a model lowers but does not run."""
        self.proto = proto
        self.precision = checked_precision(precision)  # every product's, while tracing (onnx2jax.numerics)
        self.compute_dtype = checked_compute_dtype(compute_dtype)
        self._inferred = inferred  # the model's shape inference, when a compile's plan has it
        graph = proto.graph
        topological_order(graph)  # a cycle is a ModelLoadError naming its nodes, not an undefined input later
        self.opsets = opsets_of(proto)
        missing = unsupported_ops(graph, self.opsets)
        if missing:
            raise UnsupportedOpError(missing)
        self.params: dict[str, np.ndarray] = {}
        self.constants: dict[str, np.ndarray] = {}
        shape_setting = shape_setting_inputs(graph, self.opsets)
        for init in graph.initializer:
            deferred = defer_external and onnx.external_data_helper.uses_external_data(init)
            array = ExternalTensor(init, external_dir) if deferred else initializer_array(init, external_dir)
            if _is_parameter(array) and init.name not in shape_setting:
                self.params[init.name] = array
            else:  # a constant is folded while tracing: its values are needed
                self.constants[init.name] = host_array(array)
        for sparse in graph.sparse_initializer:
            self.params[sparse.values.name] = _densify(sparse)
        if self.compute_dtype is not None:  # held in the compute dtype: half a float32 export's bytes
            self.params = {k: v.astype(self.compute_dtype) if v.dtype == np.float32 else v for k, v in self.params.items()}
        initialized = set(self.params) | set(self.constants)
        self.inputs = [input_info(i) for i in graph.input if i.name not in initialized]
        self.index_check = IndexCheck(proto, self.input_names, enabled=check_indices)  # input_checks: on each call
        self.output_names = [o.name for o in graph.output]
        self.uses_64bit = uses_wide_types(graph)
        strings = {i.name for i in self.inputs if i.dtype is not None and i.dtype.kind in "OSU"}
        self.shape_input_names = (shape_setting | strings) & set(self.input_names)
        self._jitted: dict[tuple, Any] = {}
        self._bound_keys: set = set()  # call_keys.call_key of input signatures bind_inputs accepted
        self._input_name_tuple = tuple(self.input_names)
        self._device_runtime_params: tuple | None = None
        self._segmentable, self._external_dir = segmentable, external_dir
        self._scan_setting = scan_layers
        self.scan_note = ""
        self._cuts = _segments.data_dependent_nodes(proto, inferred) if segmentable else []
        self._segment(self._cuts)

    def _segment(self, cuts: list[tuple[int, onnx.NodeProto]]) -> None:
        """Cuts the graph at ``cuts`` (none: one program), plans the layer scan and makes each segment's runner.

        A segmented model's layers are never scanned (:func:`onnx2jax.scan.plan`).
        """
        self._plan = _segments.plan(self.proto, cuts, self._inferred) if cuts else None
        self.scan = _scan.plan(
            self.proto, self._scan_setting, self.params, self.constants, segmented=self._plan is not None
        )
        self._set_runtime_params()
        self.segments: list[_segments.Segment] = list(self._plan.segments) if self._plan else []
        self.segment_models: list[JaxModel | None] = []  # per segment: its jitted sub-model, None for a host step
        self._segment_runners = [
            self._segment_runner(s, m, self._external_dir) for s, m in zip(self.segments, self._plan.models)
        ] if self._plan else []
        if self._plan:  # only what a jitted segment compiles per value; host steps take any value
            per_value = set().union(*(m.shape_input_names for m in self.segment_models if m is not None))
            self.shape_input_names = per_value & set(self.input_names)

    def _set_runtime_params(self) -> None:
        """Which parameters a call passes (as a tuple, once on the device) and which it bakes in.

        With the layers scanned, their parameters are stacked once here, not
        per call: the stacked copies go instead of the per-layer ones.
        """
        self._stacked = _scan.stacked_arrays(self.scan, self.params) if self.scan.active else {}
        scanned = _scan.per_layer_names(self.scan) if self.scan.active else set()
        self._baked_params = {
            k: v for k, v in self.params.items() if v.size <= BAKED_PARAMETER_LIMIT and k not in scanned
        }
        self._runtime_names = tuple(k for k in self.params if k not in self._baked_params and k not in scanned)
        self._runtime_names += tuple(self._stacked)
        self._device_runtime_params = None
        self._jitted.clear()

    def unscan(self, why: str) -> None:
        """Runs the layers unrolled from now on, recording ``why`` (a sharded plan the scan cannot keep).

        Raises:
          NodeError: the model was translated with ``scan_layers=True``.
        """
        if self._scan_setting is True:
            raise NodeError(f"scan_layers=True: cannot run the layers as a scan: {why}")
        self.scan = _scan.ScanPlan(False, self.scan.repetition, f"layers unrolled: {why}")
        self._set_runtime_params()

    def _cut_if(self, error: NodeError) -> bool:
        """Cuts the graph at the main-graph If whose branches ``error`` found to differ in shape.

        ONNX shape inference proves that branches differ only when it knows
        their dimensions (:func:`sharding.segments.branch_shapes_differ`); with
        unknown ones, tracing finds out. An If nested in a main-graph If's
        branch cuts that If (see :func:`_holds`); one in a Loop or Scan body
        cannot be cut. Returns whether it cut (then the caller runs again,
        segmented).
        """
        if not (self._segmentable and isinstance(error.__cause__, BranchShapesDiffer) and error.node is not None):
            return False
        outputs = list(error.node.output)  # unique in a graph; segments rename unnamed nodes
        found = [(i, n) for i, n in enumerate(self.proto.graph.node) if n.op_type == "If" and _holds(n, outputs)]
        if not found or any(i == found[0][0] for i, _ in self._cuts):
            return False
        self._cuts = sorted([*self._cuts, found[0]], key=lambda pair: pair[0])
        self._segment(self._cuts)
        return True

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.inputs]

    @property
    def segment_plan(self) -> _segments.SegmentPlan | None:
        """The cut model (its segments and a model for each), or None when it runs as one program."""
        return self._plan

    def segment_runner(self, index: int) -> Callable[[Mapping[str, Any]], Sequence[Any]]:
        """Runs segment ``index`` on its named inputs (a host step: numpy in, numpy out), unsharded."""
        return self._segment_runners[index]

    def bind_inputs(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> dict[str, Any]:
        """Maps positional and named arguments onto the graph's inputs (:func:`bind_inputs`)."""
        return bind_inputs(self.inputs, inputs, named)

    def evaluate(self, params: Mapping[str, Any], inputs: Mapping[str, Any], hooks: Hooks | None = None) -> tuple:
        """Traces the graph over ``params`` and named ``inputs``; returns the outputs in order.

        Raises:
          NodeError: the model is segmented (``model.segments``), naming the
            first node whose output shape depends on run-time values.
        """
        if self.segments:
            self._refuse_traced_segments()
        self._require_x64()
        env: dict[str, Any] = dict(self.constants)
        env.update(params)
        runner = GraphRunner(self.opsets, hooks, scan_strict=self._scan_setting is True)
        with precision_scope(self.precision), compute_scope(self.compute_dtype):
            env.update({k: narrowed(v) for k, v in inputs.items()})
            outputs = runner.run(self.proto.graph, env, scan=self.scan)
        if runner.scan_note:
            self.scan_note = runner.scan_note
        outputs = tuple(to_jax(o) for o in outputs)
        return outputs if self.compute_dtype is None else self._declared_types(outputs)

    def _declared_types(self, outputs: tuple) -> tuple:
        """Outputs computed in the compute dtype, cast back to the float types the graph declares for them."""
        cast = []
        for info, value in zip(self.proto.graph.output, outputs):
            elem = info.type.tensor_type.elem_type if info.type.HasField("tensor_type") else 0
            declared = onnx.helper.tensor_dtype_to_np_dtype(elem) if elem else None
            floating = isinstance(value, jax.Array) and jnp.issubdtype(value.dtype, jnp.floating)
            cast.append(value.astype(declared) if floating and declared is not None and declared != value.dtype else value)
        return tuple(cast)

    def layers_report(self) -> str:
        """One line: whether the repeated layers run as one ``lax.scan``, and why (:mod:`onnx2jax.scan`)."""
        return self.scan_note or self.scan.reason

    def _require_x64(self) -> None:
        """Raises PrecisionError when this model's 64-bit tensors would silently become 32-bit."""
        if self.uses_64bit and not jax.config.jax_enable_x64:
            raise PrecisionError(
                "this model has 64-bit tensors (int64/float64) and JAX's x64 mode is off, so they "
                "would silently become 32-bit. Trace it inside `with jax.enable_x64(True):`, or call "
                "the model object itself, which does that for the call only."
            )

    def _segment_runner(self, segment: _segments.Segment, model: onnx.ModelProto, external_dir: str | None) -> Callable:
        """Runs one segment on its named inputs: a jitted sub-model, or a host step in numpy."""
        if segment.kind == "jit":
            # check_indices=False: this model's own call checked the graph's inputs (input_checks)
            sub = JaxModel(
                model, external_dir, segmentable=False, scan_layers=False, check_indices=False, precision=self.precision,
                compute_dtype=self.compute_dtype,
            )
            self.segment_models.append(sub)
            return _named_runner(sub)
        self.segment_models.append(None)
        if any(n.op_type == "If" for n in model.graph.node):
            return if_step(model, lambda branch: _named_runner(
                JaxModel(branch, external_dir, scan_layers=False, check_indices=False, precision=self.precision,
                         compute_dtype=self.compute_dtype)))
        constants = {i.name: initializer_array(i, external_dir) for i in model.graph.initializer}
        opsets = opsets_of(model)

        def host(values: Mapping[str, Any]) -> list:
            with x64_scope(True):
                outputs = GraphRunner(opsets).run(model.graph, {**constants, **values})
            return [np.asarray(o) for o in outputs]

        return host

    def _refuse_traced_segments(self) -> None:
        """A segmented model has no single traceable function: say which node cuts it."""
        host = [s for s in self.segments if s.kind == "host"]
        raise NodeError(
            f"node {host[0].nodes[0]!r}: {host[0].reason}. `model.fn` cannot be traced as one function "
            f"(jax.jit, grad, vmap need static shapes); call the model itself, which runs its "
            f"{len(self.segments)} segments in turn (see `model.segments`)"
        )

    def fn(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The pure function: outputs (a tuple, in ONNX output order) of the graph.

        Raises:
          NodeError: the model is segmented (``model.segments``): naming the
            first node whose output shape depends on run-time values.
        """
        if self.segments:
            self._refuse_traced_segments()
        self._require_x64()  # before binding: without x64, jit hands int64 inputs over as int32
        return self.evaluate(params, self.bind_inputs(inputs, named))

    def split_static(self, bound: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, np.ndarray], tuple]:
        """Separates the inputs that set shapes (see ``shape_input_names``) from the others.

        Returns:
          (runtime inputs, shape-setting inputs as numpy, a hashable key of the latter's values)
        """
        dynamic = {k: v for k, v in bound.items() if k not in self.shape_input_names}
        static = {k: np.asarray(v) for k, v in bound.items() if k in self.shape_input_names}
        key = tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in sorted(static.items()))
        return dynamic, static, key

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the model jitted, with 64-bit types on for this call only.

        One compile per input-shape signature, and per distinct value of the
        inputs that set shapes. Outputs that the host finishes (string labels
        chosen at run time, ZipMap's maps: :mod:`onnx2jax.hostvalues`) come
        back finished, as onnxruntime returns them.
        """
        return tuple(to_host(o) for o in self._call(inputs, named))

    def _call(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple:
        try:
            return self._call_once(inputs, named)
        except NodeError as e:
            if not self._cut_if(e):
                raise
        return self._call(inputs, named)

    def _call_once(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple:
        self.index_check.call(inputs, named)
        key = call_key(inputs, named)
        if key is not None and key in self._bound_keys:
            # Types, shapes and names this model already checked: bind without checking again.
            bound = dict(zip(self._input_name_tuple, inputs))
            bound.update(named)
        else:
            bound = self.bind_inputs(inputs, named)
            if key is not None:
                self._bound_keys.add(key)
        if self._plan is not None:
            # Constants in the environment too: a graph output may be an initializer.
            return _segments.run(self._plan, self._segment_runners, {**self.constants, **self.params, **bound}, self.output_names)
        x64 = self.uses_64bit and not jax.config.jax_enable_x64
        if not self.shape_input_names:
            # The common case, kept short: jax.jit's own C++ dispatch finds the executable for
            # the input shapes, and the runtime parameters go as one tuple already on the device.
            if x64:
                with x64_scope(True):
                    return self._program(())(self._runtime_params(), bound)
            return self._program(())(self._runtime_params(), bound)
        with x64_scope(self.uses_64bit):
            dynamic, static, key = self.split_static(bound)
            if static and not dynamic:
                # Every input is a constant (string models, say): the graph folds while
                # tracing, so evaluate it directly; its outputs may be strings, which jit cannot return.
                return self.evaluate(self.params, static)
            return self._program(key, static)(self._runtime_params(), dynamic)

    def _program(self, key: tuple, static: Mapping[str, np.ndarray] | None = None):
        """The jitted program for one value of the shape-setting inputs: ``f(runtime params, inputs)``."""
        jitted = self._jitted.get(key)
        if jitted is None:
            names, baked, static = self._runtime_names, self._baked_params, dict(static or {})
            jitted = self._jitted[key] = jax.jit(
                lambda params, values: self.evaluate({**dict(zip(names, params)), **baked}, {**values, **static}),
                compiler_options=compiler_options(jax.default_backend()),
            )
        return jitted

    def _runtime_params(self) -> tuple:
        """The parameters that are not baked in, on the device (copied once, not on every call)."""
        if self._device_runtime_params is None:
            # Uncommitted (jax.device_put without a device), so that a jit under a context mesh may move
            # them; on CPU an aligned read-only array (a mapped weight, a built stack) is held without a copy.
            self._device_runtime_params = tuple(map(_uncommitted, (
                self._stacked[k].host() if k in self._stacked else self.params[k] for k in self._runtime_names
            )))
            for name in self._runtime_names:
                if name in self.params:
                    drop_pages(self.params[name])
        return self._device_runtime_params


def _holds(node: onnx.NodeProto, outputs: list[str]) -> bool:
    """Whether ``node`` is the node with these outputs, or holds it in a subgraph (at any depth).

    An If nested in a branch that fails on its shapes makes the main-graph If
    around it the one to cut: its branch then runs as a model of its own, where
    the nested If is a main-graph node.
    """
    return list(node.output) == outputs or any(_holds(n, outputs) for sub in subgraphs(node) for n in sub.node)


def _named_runner(model: JaxModel) -> Callable[[Mapping[str, Any]], tuple]:
    """Runs ``model`` on named inputs (a segment's runner): outputs in its order, left on the device."""
    return lambda values: model._call((), values)


def _is_parameter(array: np.ndarray) -> bool:
    if array.dtype.kind in "fc" or array.dtype.name in ("bfloat16",) or array.dtype.name.startswith("float8"):
        return True
    return array.size > STATIC_INITIALIZER_LIMIT


def _densify(sparse: onnx.SparseTensorProto) -> np.ndarray:
    values = onnx.numpy_helper.to_array(sparse.values)
    indices = onnx.numpy_helper.to_array(sparse.indices)
    dense = np.zeros(int(np.prod(sparse.dims)), dtype=values.dtype)
    flat = indices if indices.ndim == 1 else np.ravel_multi_index(indices.T, tuple(sparse.dims))
    dense[flat] = values
    return dense.reshape(tuple(sparse.dims))


def translate(
    model: ModelLike,
    *,
    scan_layers: _scan.ScanSetting = "auto",
    check_indices: bool = True,
    precision: str = "auto",
    compute_dtype: str | None = None,
) -> JaxModel:
    """Translates an ONNX model into a :class:`JaxModel`.

    64-bit types: ONNX models are full of int64 (ids, shapes) and sometimes
    float64. JAX turns those into 32-bit unless its x64 mode is on, and that
    mode is a global setting. onnx2jax never changes it globally: calling the
    model object enables x64 for that call only (:func:`onnx2jax.x64.x64_scope`).
    When you trace ``model.fn`` yourself, do it inside
    ``with jax.enable_x64(True):`` if ``model.uses_64bit``; otherwise a
    :class:`PrecisionError` says so instead of silently narrowing types.

    Repeated layers: a transformer's N copies of one layer can run as one
    ``jax.lax.scan`` over stacked parameters, so compile time does not grow
    with depth (:mod:`onnx2jax.scan`). ``model.layers_report()`` says which
    form runs and why.

    Args:
      model: a path, serialized bytes, or ModelProto.
      scan_layers: ``"auto"`` scans from ``onnx2jax.scan.AUTO_MIN_LAYERS``
        repeated layers; ``True`` scans or raises saying why it cannot;
        ``False`` always unrolls.
      check_indices: before each call, refuse integer inputs that index a
        table beyond its size (:mod:`onnx2jax.input_checks`: XLA would answer
        them with clamped or NaN rows); ``False`` skips that host-side check, for
        inputs known to be in range (``model.index_check.enabled`` later).
      precision: the precision of every matrix product (:mod:`onnx2jax.numerics`):
        ``"auto"`` (float32 fidelity, ``HIGHEST``, except bf16 products on a TPU),
        ``"highest"``, ``"high"`` or ``"default"`` (docs/tpu-numerics.md).
      compute_dtype: ``"bfloat16"`` (or ``"float16"``) runs a float32 export in that dtype: its float32
        parameters held in it, inputs and every float32 value computed cast to it, outputs cast back to
        the model's declared types (:mod:`onnx2jax.numerics`). None: the model's own types.

    Raises:
      ValueError: ``precision`` or ``compute_dtype`` is not one of those.
      UnsupportedOpError: listing every unsupported op of the model at once.
      ModelLoadError: the file or its external data cannot be read safely.

    Example:
      >>> m = translate("tests/data/tiny_llama.onnx")   # doctest: +SKIP
      >>> (logits,) = m(np.zeros((1, 8), np.int64))     # doctest: +SKIP
    """
    return JaxModel(
        *open_model(model), scan_layers=scan_layers, check_indices=check_indices, precision=precision,
        compute_dtype=compute_dtype,
    )


def _uncommitted(array: np.ndarray) -> jax.Array:
    """``array`` on the default device, uncommitted, keeping a 64-bit dtype (:func:`onnx2jax.placing.holding`)."""
    with holding(array.dtype):
        return jax.device_put(array)
