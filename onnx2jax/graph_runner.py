"""The graph interpreter: runs an ONNX graph's nodes over an environment of values.

:class:`GraphRunner` walks the nodes in their stored (topological) order,
keeping a name -> value environment. A value is either *static* (a numpy
array, known while tracing: constants, shapes, anything computed only from
them) or *traced* (a jax array). A node whose inputs are all static is
evaluated at trace time, with numpy where :mod:`onnx2jax.host_fold` gives
jax's exact result (integer and boolean shape and mask arithmetic: no small
XLA program compiled per op), under ``jax.ensure_compile_time_eval``
otherwise, so that Shape -> Gather -> Concat -> Reshape chains fold into
numpy and Reshape/Expand/Slice/Tile get static arguments. A folded result
over ``FOLD_LIMIT_BYTES`` that no shape depends on (a causal mask
``[B, 1, S, S]``) is computed in the program instead: a folded value that a
traced op reads becomes a constant baked into the executable.

Also here, what the translator asks of a graph before running it: its opsets
(:func:`opsets_of`), the ops it lacks (:func:`unsupported_ops`), the names
whose values set shapes (:func:`shape_setting_inputs`) and whether it has
64-bit tensors (:func:`uses_wide_types`). :class:`Hooks` lets
``onnx2jax.compile`` wrap each node (:mod:`onnx2jax.runtime.constraints`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.defs
import onnx.helper
import onnx.numpy_helper

from onnx2jax import ops as _ops  # noqa: F401  (fills the registry)
from onnx2jax import host_fold
from onnx2jax import scan as _scan
from onnx2jax import symbolic
from onnx2jax.errors import NodeError, UnsupportedOpError
from onnx2jax.hostvalues import is_host_value
from onnx2jax.numerics import narrowed
from onnx2jax.ops.registry import OpImpl, lookup
from sharding import op_facts

_WIDE_TYPES = frozenset(
    {
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.COMPLEX128,
    }
)


class Hooks(Protocol):
    """Lets a caller wrap the execution of each node.

    ``onnx2jax.compile`` uses this to put sharding constraints on node inputs
    and outputs, and to run some nodes on unfused views of fused-axis
    tensors; plain translation uses none.
    """

    def run_node(
        self, node: onnx.NodeProto, inputs: list, attrs: dict[str, Any], compute: Callable[[list], list]
    ) -> list:
        """Returns the node's outputs; ``compute(inputs)`` runs its implementation
        (``compute(inputs, override={...})`` with some attributes replaced)."""
        ...


@dataclasses.dataclass
class OpContext:
    """What the few context-taking ops (control flow, Shape-like ops) may see."""

    node_name: str
    op_type: str
    opset: int
    run_graph: Callable[[onnx.GraphProto, Sequence[Any]], list]
    output_count: int


def is_static(value: Any) -> bool:
    """A value known while tracing (numpy), as opposed to a jax array or tracer."""
    return isinstance(value, (np.ndarray, np.generic))


@functools.lru_cache(maxsize=None)
def _resolve(domain: str, op_type: str, opset: int) -> OpImpl | None:
    return lookup(domain, op_type, opset)


@functools.lru_cache(maxsize=None)
def _schema_attributes(domain: str, op_type: str, opset: int):
    try:
        return onnx.defs.get_schema(op_type, opset, domain).attributes
    except onnx.defs.SchemaError:
        return {}


def _attribute_value(attr: onnx.AttributeProto) -> Any:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        if value and isinstance(value[0], bytes):
            return tuple(v.decode("utf-8") for v in value)
        if value and isinstance(value[0], onnx.TensorProto):
            return tuple(onnx.numpy_helper.to_array(v) for v in value)
        return tuple(value)
    return value


def node_attributes(node: onnx.NodeProto, domain: str, opset: int) -> dict[str, Any]:
    """The node's attributes with the schema's defaults filled in.

    Raises:
      NodeError: a required attribute is missing.
    """
    given = {a.name: _attribute_value(a) for a in node.attribute}
    for name, spec in _schema_attributes(domain, node.op_type, opset).items():
        if name in given:
            continue
        if spec.default_value.type != onnx.AttributeProto.UNDEFINED:
            given[name] = _attribute_value(spec.default_value)
        elif spec.required:
            raise NodeError(
                f"node {node.name!r} ({node.op_type}): required attribute {name!r} is missing"
            )
    return given


def subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def unsupported_ops(graph: onnx.GraphProto, opsets: Mapping[str, int]) -> list[tuple[str, str, int]]:
    """Every (domain, op_type, opset) in ``graph`` and its subgraphs with no implementation."""
    missing = []
    for node in graph.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = opsets.get(domain)
        if opset is None or _resolve(domain, node.op_type, opset) is None:
            missing.append((domain, node.op_type, opset if opset is not None else -1))
        for sub in subgraphs(node):
            missing.extend(unsupported_ops(sub, opsets))
    return missing


def shape_setting_inputs(graph: onnx.GraphProto, opsets: Mapping[str, int]) -> set[str]:
    """Names whose *values* must be known while tracing: they reach an op's static input.

    Walks back from every static input position (a Reshape's shape, a Slice's
    starts, ...; a growing Loop's trip count, see ``_growing_loop_controls``)
    through the ops that compute it, stopping at Shape/Size/SequenceLength,
    which read only shapes. Subgraph bodies count too. An If's outputs are
    followed into both branches' outputs, so a shape computed in a branch
    from outer values makes those values static; its condition is not
    followed (a condition known only at run time keeps the If a ``lax.cond``,
    whose outputs then stay runtime values). Loop and Scan stop the walk.
    """
    needed: set[str] = set()
    nodes = list(_all_nodes(graph))
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        impl = _resolve(domain, node.op_type, opsets.get(domain, -1))
        if impl is not None:
            needed.update(node.input[i] for i in impl.static_inputs if i < len(node.input) and node.input[i])
    needed.update(_container_choices(graph, nodes))
    needed.update(_growing_loop_controls(nodes))
    producers = {out: node for node in nodes for out in node.output if out}
    frontier = list(needed)
    while frontier:
        node = producers.get(frontier.pop())
        if node is None or node.op_type in op_facts.SHAPE_READERS:
            continue
        sources = list(node.input)
        if node.op_type == "If":
            sources = [o.name for sub in subgraphs(node) for o in sub.output]
        elif any(True for _ in subgraphs(node)):
            continue
        for name in sources:
            if name and name not in needed:
                needed.add(name)
                frontier.append(name)
    return needed


def _container_choices(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> set[str]:
    """Graph inputs that are the condition of an If whose branches return sequences or optionals.

    ``lax.cond`` needs both branches to return one structure, which sequences
    (their lengths) and optionals (empty or not) seldom share. A condition
    read straight from a graph input is cheap to make a compile-time value
    (one compile per value, two for a bool), and then only the chosen branch runs.
    """
    inputs = {i.name for i in graph.input}
    return {
        node.input[0]
        for node in nodes
        if node.op_type == "If" and node.input and node.input[0] in inputs
        and any(_is_container(o) for sub in subgraphs(node) for o in sub.output)
    }


def _is_container(info: onnx.ValueInfoProto) -> bool:
    return info.type.WhichOneof("value") in ("sequence_type", "optional_type")


def _growing_loop_controls(nodes: list[onnx.NodeProto]) -> set[str]:
    """The trip count and first condition of each Loop whose outputs grow with its iterations.

    A Loop with scan outputs, or carrying sequences, returns values whose
    length is its number of iterations: like a Reshape's target, the values
    that decide it set shapes, so they are compile-time values (the walk back
    from them makes the graph inputs they come from constants, one compile per value).
    """
    controls = set()
    for node in nodes:
        if node.op_type != "Loop":
            continue
        body = next(subgraphs(node))
        carried = len(node.input) - 2
        if len(body.output) > 1 + carried or any(_is_container(o) for o in body.output[1 : 1 + carried]):
            controls.update(name for name in node.input[:2] if name)
    return controls


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for sub in subgraphs(node):
            yield from _all_nodes(sub)


def to_jax(value: Any) -> Any:
    """A graph output as jax: static arrays converted (a shape holding symbolic dims too), sequences
    (lists) element-wise, None kept.

    Strings have no jax dtype: a string output stays a numpy array.
    """
    if isinstance(value, list):
        return [to_jax(v) for v in value]
    if symbolic.is_symbolic(value):
        return symbolic.as_jax(value)
    if is_static(value) and np.asarray(value).dtype.kind not in "OSU":
        return jnp.asarray(value)
    return value


FOLD_LIMIT_BYTES = 1 << 16
"""A node computed from constants alone is folded while tracing only while its outputs stay within this many
bytes; a larger one (a causal mask ``[B, 1, S, S]``: 4 MiB at [1, 2048], 512 MiB at [128, 2048]) runs in the
program, unless a shape depends on its value. A folded value is baked into the executable as a constant: the
program's size, the compiler's host memory and its compile time grow with it, whereas computing a mask from
its small folded inputs (positions, lengths) costs the device one elementwise pass. Shape chains, positions
and the rotary tables of a sequence (8 KiB at 2048) stay below it and keep folding."""


class GraphRunner:
    """Evaluates one graph (and its subgraphs) over an environment of values."""

    def __init__(self, opsets: Mapping[str, int], hooks: Hooks | None = None, *, scan_strict: bool = False):
        self.opsets = dict(opsets)
        self.hooks = hooks
        self.scan_strict = scan_strict
        self.scan_note = ""
        self._root: onnx.GraphProto | None = None  # the outermost graph run, for _sets_shapes
        self._shape_names: set[str] | None = None

    def run(self, graph: onnx.GraphProto, env: dict[str, Any], scan: _scan.ScanPlan | None = None) -> list:
        """Runs every node of ``graph`` in ``env`` (updated in place); returns its outputs.

        With an active ``scan`` plan the repeated layers run as one
        ``lax.scan`` (:mod:`onnx2jax.scan`); ``self.scan_note`` then says
        whether they had to run unrolled instead, and why.
        """
        if self._root is None:
            self._root = graph
        if scan is not None and scan.active:
            self.scan_note = _scan.run(scan, graph, self.run_nodes, env, strict=self.scan_strict)
        else:
            self.run_nodes(graph.node, env)
        missing = [o.name for o in graph.output if o.name not in env]
        if missing:
            raise NodeError(f"graph {graph.name!r}: outputs {missing} are never produced")
        return [env[o.name] for o in graph.output]

    def run_nodes(self, nodes: Sequence[onnx.NodeProto], env: dict[str, Any]) -> None:
        """Runs ``nodes`` in order over ``env`` (updated in place)."""
        for node in nodes:
            self._run_node(node, env)

    def run_subgraph(self, graph: onnx.GraphProto, outer: Mapping[str, Any], inputs: Sequence[Any]) -> list:
        """Runs a subgraph whose formal inputs are bound to ``inputs``; outer names stay visible."""
        env = dict(outer)
        for info, value in zip(graph.input, inputs):
            env[info.name] = value
        for init in graph.initializer:
            env[init.name] = onnx.numpy_helper.to_array(init)
        return self.run(graph, env)

    def _run_node(self, node: onnx.NodeProto, env: dict[str, Any]) -> None:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = self.opsets.get(domain, -1)
        impl = _resolve(domain, node.op_type, opset)
        where = f"node {node.name!r} ({node.op_type}, opset {opset})"
        if impl is None:
            raise UnsupportedOpError([(domain, node.op_type, opset)])
        inputs = []
        for name in node.input:
            if not name:
                inputs.append(None)
            elif name in env:
                inputs.append(env[name])
            else:
                raise NodeError(f"{where}: input {name!r} is not defined before it is used")
        attrs = node_attributes(node, domain, opset)
        compute = functools.partial(self._compute, node, impl, attrs, env, where)
        if self.hooks is None:
            outputs = compute(inputs)
        else:
            outputs = self.hooks.run_node(node, inputs, attrs, compute)
        for name, value in zip(node.output, outputs):
            if name:
                env[name] = value

    def _compute(
        self,
        node: onnx.NodeProto,
        impl: OpImpl,
        attrs: dict[str, Any],
        env: dict[str, Any],
        where: str,
        inputs: list,
        override: Mapping[str, Any] | None = None,
    ) -> list:
        """Runs one node's implementation on ``inputs``; returns its outputs as a list.

        ``override`` replaces attributes: a hook running the op on another
        view of its inputs (an unfused axis) renumbers the axes it names.
        """
        if override:
            attrs = {**attrs, **override}
        for position in impl.static_inputs:
            if position < len(inputs) and inputs[position] is not None and not is_static(inputs[position]):
                raise NodeError(
                    f"{where}: input {position} ({node.input[position]!r}) must be known while "
                    "tracing (it sets a shape), but it depends on runtime data"
                )
        if not impl.host_values:
            for name, value in zip(node.input, inputs):
                if is_host_value(value):
                    raise NodeError(
                        f"{where}: input {name!r} is {value.describe()}; its values exist only after the "
                        "run (JAX has no strings or maps), so only a graph output or Identity can take it"
                    )
        all_static = not any(True for _ in subgraphs(node)) and all(
            v is None or is_static(v) for v in inputs
        )
        symbolic_inputs = any(symbolic.is_symbolic(v) for v in inputs)
        if symbolic_inputs and not (all_static and node.op_type in symbolic.STRUCTURAL | symbolic.FOLDED):
            inputs = symbolic.as_jax_inputs(inputs, impl.static_inputs)
            all_static = False
        args: list[Any] = list(inputs)
        if impl.needs_context:
            ctx = OpContext(
                node_name=node.name,
                op_type=node.op_type,
                opset=self.opsets.get("" if node.domain == "ai.onnx" else node.domain, -1),
                run_graph=lambda g, values: self.run_subgraph(g, env, values),
                output_count=len(node.output),
            )
            args = [ctx, *args]
        try:
            if all_static and symbolic_inputs:
                result = _symbolic_step(node, impl, args, inputs, attrs)
            elif all_static:
                result = _host_fold(node, args, attrs, impl)
                if result is None:
                    with jax.ensure_compile_time_eval():
                        result = impl.fn(*args, **attrs)
                result = _as_static(result)
                if _over_fold_limit(result) and not self._sets_shapes(node):
                    result = impl.fn(*args, **attrs)  # in the program, from its small folded inputs
            else:
                result = impl.fn(*args, **attrs)
        except (NodeError, UnsupportedOpError):
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the node named
            error = NodeError(f"{where}: {type(e).__name__}: {e}")
            error.node = node
            raise error from e
        result = narrowed(result)  # a compute dtype's (onnx2jax.numerics): float32 results computed in it
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        if len(outputs) < len([o for o in node.output if o]):
            raise NodeError(f"{where}: produced {len(outputs)} outputs, the node names {len(node.output)}")
        return outputs[: len(node.output)]


    def _sets_shapes(self, node: onnx.NodeProto) -> bool:
        """Whether a shape depends on one of ``node``'s outputs (:func:`shape_setting_inputs`), so that
        they must stay folded whatever their size; worked out once, the first time a fold is too large."""
        if self._shape_names is None:
            self._shape_names = shape_setting_inputs(self._root, self.opsets) if self._root is not None else set()
        return any(name in self._shape_names for name in node.output if name)


def _over_fold_limit(result: Any) -> bool:
    """Whether a folded numeric result holds more than ``FOLD_LIMIT_BYTES`` (strings and sequences never move)."""
    values = result if isinstance(result, (tuple, list)) else [result]
    arrays = [v for v in values if isinstance(v, np.ndarray) and v.dtype.kind in "biufc"]
    return len(arrays) == len(values) and sum(v.nbytes for v in arrays) > FOLD_LIMIT_BYTES


def _symbolic_step(node: onnx.NodeProto, impl: OpImpl, args: list, inputs: list, attrs: dict[str, Any]) -> Any:
    """A node on symbolic shape values (:mod:`onnx2jax.symbolic`): folded on the objects, or its
    implementation on them (a structural op, numpy moving the objects; or jax where the result is a
    tensor of symbolic shape, which the implementation decides)."""
    domain = "" if node.domain == "ai.onnx" else node.domain
    result = symbolic.fold(node.op_type, inputs, attrs) if domain == "" else None
    if result is None and node.op_type not in symbolic.STRUCTURAL:
        head = args[: len(args) - len(inputs)]  # the context, for ops that take one
        result = impl.fn(*head, *symbolic.as_jax_inputs(inputs, impl.static_inputs), **attrs)
    elif result is None:
        result = impl.fn(*args, **attrs)
    if isinstance(result, (tuple, list)):
        return type(result)(_symbolic_static(r) for r in result)
    return _symbolic_static(result)


def _symbolic_static(result: Any) -> Any:
    """An object result is a shape value again (int64 when no symbolic element is left; numpy hands an
    element picked from an object array back bare, a ``DimExpr``); numpy scalars are arrays; jax is kept."""
    if (isinstance(result, np.ndarray) and result.dtype == object) or symbolic.is_dim(result):
        return symbolic.value(result)
    return np.asarray(result) if isinstance(result, np.generic) else result


def _host_fold(node: onnx.NodeProto, args: list, attrs: dict[str, Any], impl: OpImpl) -> Any:
    """The node's result computed with numpy (:mod:`onnx2jax.host_fold`), or None.

    Skipped where jax would narrow 64-bit values (x64 off: a 64-bit input, or a Cast to a 64-bit
    type), so that both ways give one dtype.
    """
    wide = lambda v: v is not None and np.asarray(v).dtype.itemsize == 8  # noqa: E731
    narrowing = not jax.config.jax_enable_x64
    if impl.needs_context or (narrowing and any(wide(v) for v in args)):
        return None
    result = host_fold.fold("" if node.domain == "ai.onnx" else node.domain, node.op_type, args, attrs)
    return None if narrowing and wide(result) else result


def _as_static(result: Any) -> Any:
    if isinstance(result, (tuple, list)):
        return type(result)(_as_static(r) for r in result)
    if result is None or isinstance(result, list) or is_host_value(result):
        return result
    return np.asarray(result)


def opsets_of(model: onnx.ModelProto) -> dict[str, int]:
    opsets = {}
    for entry in model.opset_import:
        opsets["" if entry.domain == "ai.onnx" else entry.domain] = entry.version
    return opsets


def _elem_types(type_proto: onnx.TypeProto):
    """The tensor element types inside a (possibly sequence or optional) type."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        yield type_proto.tensor_type.elem_type
    elif kind == "sequence_type":
        yield from _elem_types(type_proto.sequence_type.elem_type)
    elif kind == "optional_type":
        yield from _elem_types(type_proto.optional_type.elem_type)


def uses_wide_types(graph: onnx.GraphProto) -> bool:
    """Whether the graph or any subgraph (a Loop body's int64 counter, say) has 64-bit tensors.

    Declared types are not enough: a float model may make int64 values inside
    (a Cast to int64, ArgMax's indices) with no value_info saying so.
    """
    infos = list(graph.input) + list(graph.output) + list(graph.value_info)
    if any(t in _WIDE_TYPES for i in infos for t in _elem_types(i.type)):
        return True
    if any(t.data_type in _WIDE_TYPES for t in graph.initializer):
        return True
    for node in graph.node:
        if node.op_type in op_facts.INT64_RESULTS:
            return True
        if node.op_type in ("Cast", "Constant", "ConstantOfShape", "EyeLike", "RandomNormal", "RandomUniform"):
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.i in _WIDE_TYPES:
                    return True
                if attr.name == "value" and attr.t.data_type in _WIDE_TYPES:
                    return True
    return any(uses_wide_types(sub) for node in graph.node for sub in subgraphs(node))
