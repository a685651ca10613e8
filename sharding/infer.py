"""Completing a model's partial sharding annotations (proposal 0007, extended): one graph.

One topological walk over the main graph (:func:`infer_graph`); a model with
pipeline stages is sent here stage by stage by the front, ``sharding.infer``
(:func:`sharding.stage_infer.infer`), which also gives the ``stage-invalid``
and ``pipeline-stage`` diagnostics below. At each node:

1. Input specs: the one written on the node; else the spec the producer left
   (`Inference.tensors`); else, for a model input, an initializer or anything
   not yet placed, unsharded: replicated on the node's devices (an
   initializer has no producer: another consumer's written spec is not
   its spec, proposal 0007). The node's
   devices are those of its written specs, or else of its inputs' specs; a
   node with neither stays unplaced (its specs are None).
2. The op's rule (`sharding.rules`) checks the inputs and infers the outputs.
   A written input spec that differs from the producer's is a reshard (a
   note naming its collective); so is a written output spec that differs from
   the inferred one. A written spec the op cannot use is an error.
3. Output specs: the written one, else the inferred one. An op no rule covers
   runs unannotated (its outputs unplaced); annotated, it gets an
   ``unsupported-op`` diagnostic. Nodes with subgraphs (If, Loop, Scan) are
   opaque in the same way.

Diagnostic codes (besides those of `sharding.validate`):

======================  ========  ===========================================
code                    severity  meaning
======================  ========  ===========================================
sharding-mismatch       error     two inputs shard one axis differently
k-sharding-mismatch     error     MatMul-like: the K axes differ
broadcast-axis-sharded  error     a broadcast size-1 axis is sharded
empty-intersection      error     no device holds all shards an output needs
spatial-axis-sharded    error     a conv, pool or resize spatial axis is cut
group-split             error     a channel cut splits a conv's groups
attention-axis-sharded  error     an attention sequence/head-size axis or
                                  rotary table is cut
attention-heads-split   error     a cut splits attention heads or a packed
                                  q|k|v
quantized-block-split   error     a cut splits a MatMulNBits quantisation
                                  block
stage-invalid           error     pipeline stages cannot be placed on devices
fused-axis-size         error     a fused spec has no layout at a call's shapes
annotation-invalid      error     an annotation cannot be read
unknown-configuration   error     the configuration asked for is not defined
unsupported-op          warning   an annotated op with no rule (error on request)
reshape-unsupported     warning   a sharded axis cannot follow a reshape
einsum-unsupported      warning   an Einsum outside the MatMul-like cases
shape-unknown           warning   a rule lacks a shape or constant it needs
                                  (an error at compile, for a spec's tensor)
shape-inference-failed  warning   ONNX shape inference failed
rule-failed             warning   a rule raised (a bug): outputs unplaced
reshard                 note      a written spec differs: data moves (kind)
collective              note      the op itself combines shards (kind)
no-rule                 note      sharded data enters an op with no rule
configuration-chosen    note      several configurations; which was used
pipeline-stage          note      one stage: its nodes, devices and sends
======================  ========  ===========================================
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper

from sharding import codes
from sharding.model_arg import ModelArg, as_model_proto
from sharding.configuration import choose_configuration
from sharding.diagnostics import Diagnostic
from sharding.inference import Inference, NodeShardings
from sharding.reshard import reshard_kind
from sharding.rules import rule_for
from sharding.shapes import CONSTANT_LIMIT, tensor_shapes, topological_order
from sharding.rules.base import NodeContext, Shape, text
from sharding.rules.normalization import statistics_kept_split
from sharding.rules.views import node_devices, renamed, replicated, sharded_dims
from sharding.model_configs import NodeConfig
from sharding.spec import ShardingSpec
from sharding.written import WrittenAnnotations, annotations_by_index


class _Constants(Mapping):
    """Initializer and Constant values by name, converted on first use."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._protos: dict[str, onnx.TensorProto] = {}
        for init in graph.initializer:
            self._protos[init.name] = init
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                        self._protos[node.output[0]] = attr.t
                    elif attr.name in ("value_int", "value_ints"):
                        self._protos[node.output[0]] = numpy_helper.from_array(
                            np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.int64)
                        )
        self._values: dict[str, np.ndarray | None] = {}
        self._keys: dict[str, tuple] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._values:
            proto = self._protos[name]
            small = math.prod(proto.dims) <= CONSTANT_LIMIT and proto.data_location != onnx.TensorProto.EXTERNAL
            self._values[name] = numpy_helper.to_array(proto) if small else None
        value = self._values[name]
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name: object) -> bool:
        return name in self._protos

    def key(self, name: str) -> tuple:
        """A hashable stand-in for the value: the value itself when small, else its shape."""
        found = self._keys.get(name)
        if found is None:
            proto = self._protos[name]
            if math.prod(proto.dims) > 64 or proto.data_location == onnx.TensorProto.EXTERNAL:
                found = ("large", proto.data_type, tuple(proto.dims))
            else:
                value = self[name]
                found = ("small", str(value.dtype), value.shape, value.tobytes())
            self._keys[name] = found
        return found

    def get(self, name, default=None):
        try:
            return self[name]
        except KeyError:
            return default

    def __iter__(self) -> Iterator[str]:
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)


# ------------------------------------------------------------------ walk


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def _by_index(model: onnx.ModelProto, written: Mapping[str, NodeConfig]) -> dict[int, NodeConfig]:
    """``written`` (by node name) keyed by node index, as `annotations_by_index` gives it."""
    unknown = set(written) - {node.name for node in model.graph.node}
    if unknown:
        raise ValueError(f"infer(written=...) names nodes the model lacks: {sorted(unknown)[:5]}")
    return {index: written[node.name] for index, node in enumerate(model.graph.node) if node.name in written}


def _reshard_note(
    node: onnx.NodeProto, tensor: str, src: ShardingSpec, dst: ShardingSpec, kind: str, where: str
) -> Diagnostic:
    return Diagnostic(
        code=codes.RESHARD,
        severity="note",
        node=node.name,
        op_type=node.op_type,
        tensor=tensor,
        message=f"{where}: {text(src)} -> {text(dst)} ({kind})",
        given=text(dst),
        expected=text(src),
        hint=None,
    )


def reshard_note_kind(note: Diagnostic) -> str:
    """The collective a ``reshard`` note names (`_reshard_note` ends its message in ``(kind)``)."""
    if note.code != codes.RESHARD:
        raise ValueError(f"expected a reshard note, got {note.code!r}")
    return note.message.rsplit("(", 1)[-1].rstrip(")")


def infer_graph(
    model: ModelArg,
    configuration: str | None = None,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    unsupported: str = "warning",
    shapes: tuple[Mapping[str, Shape], Sequence[Diagnostic]] | None = None,
    written: Mapping[str, NodeConfig] | None = None,
    annotations: WrittenAnnotations | None = None,
) -> Inference:
    """Completes the sharding annotations of the main graph, as one graph (pipeline stages are not read).

    ``sharding.infer`` (:func:`sharding.stage_infer.infer`) is the front every caller uses: it sends a model
    whose configuration has pipeline stages stage by stage, each stage's model here, and any other model
    straight here. This walk knows nothing of stages.

    Args:
        model: The model; not modified.
        configuration: The device configuration to use; by default the
            model's first (a note says so when there are several).
        input_shapes: Concrete dims of model inputs, for rules that need
            sizes where the model has symbols.
        unsupported: Severity of ``unsupported-op``: ``"warning"`` or ``"error"``.
        shapes: ``sharding.shapes.tensor_shapes(model, input_shapes)`` when
            the caller has it already (a compile computes it once).
        written: The specs to take as written, by node name, in place of the
            model's own annotations (which are then not read): a candidate
            plan evaluated as data, on one model, with no copy written
            (`sharding.auto`). Every entry names ``configuration``, which
            must then be given.
        annotations: The model's annotations and order as
            `sharding.written.read_annotations` read them for the
            configuration chosen, when the caller has them (a compile
            infers again per call shape); not read again then.

    Returns:
        The `Inference`: every node's specs, every placed tensor's spec, and
        every problem found.

    Example:
        >>> result = infer_graph(model)  # doctest: +SKIP
        >>> result.tensors["logits"]  # doctest: +SKIP
        ShardingSpec('logits', '2:4 @ [0,1,2,3]')
    """
    model = as_model_proto(model)
    if unsupported not in ("warning", "error"):
        raise ValueError(f"unsupported must be 'warning' or 'error', got {unsupported!r}")
    diags: list[Diagnostic] = []
    if written is not None:
        if configuration is None:
            raise ValueError("infer(written=...) needs the configuration its specs name")
        config = configuration
    else:
        choice = choose_configuration(model, configuration)
        diags += choice.diagnostics
        config = choice.name
    if annotations is not None:
        if written is not None or annotations.configuration != config or len(annotations.order) != len(model.graph.node):
            raise ValueError(
                f"infer(annotations=...) was read for configuration {annotations.configuration!r} and "
                f"{len(annotations.order)} nodes; this call infers {config!r} on {len(model.graph.node)} nodes"
                + (" with written=" if written is not None else "")
            )
        order = list(annotations.order)
    else:
        order = topological_order(model.graph)
    shapes, shape_diags = shapes if shapes is not None else tensor_shapes(model, input_shapes, order)
    shape_diags = list(shape_diags)
    diags += shape_diags
    if annotations is not None:
        diags += annotations.diagnostics
        annotations = annotations.by_index
    else:
        annotations = annotations_by_index(model, config, diags) if written is None else _by_index(model, written)
    constants = _Constants(model.graph)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
    graph = model.graph
    tensors: dict[str, ShardingSpec] = {}
    nodes: dict[str, NodeShardings] = {}
    all_nodes = list(graph.node)
    initializers = {init.name for init in graph.initializer}
    memo: dict[tuple, tuple] = {}
    for index in order:
        node = all_nodes[index]
        ins, outs = list(node.input), list(node.output)
        key = node.name or f"{node.op_type}#{index}"
        annotation = annotations.get(index)
        given = {s.tensor_name: s for s in annotation.specs} if annotation else {}
        known = [given.get(n) or (None if n in initializers else tensors.get(n)) for n in ins if n]
        devices = node_devices(given.values()) or node_devices(known)
        in_specs: list[ShardingSpec | None] = []
        for name in ins:
            if not name:
                in_specs.append(None)
                continue
            spec = given.get(name)
            # An initializer has no producer: a spec written for one consumer is
            # that consumer's, not the tensor's (exporters share one bias among many).
            produced = None if name in initializers else tensors.get(name)
            if spec is not None and produced is not None:
                kind = reshard_kind(produced, spec, shapes.get(name))
                if kind is not None:
                    diags.append(_reshard_note(node, name, produced, spec, kind, "input resharded"))
            if spec is None:
                spec = produced
            if spec is None and devices:
                spec = replicated(name, devices)
            if spec is not None and name not in tensors:
                tensors[name] = renamed(spec, name)
            in_specs.append(spec)
        rule = rule_for(node.op_type, node.domain)
        if rule is not None and node.attribute and _has_subgraph(node):
            rule = None
        inferred: list[ShardingSpec | None] = [None] * len(outs)
        notes: list[Diagnostic] = []
        if rule is not None and devices:
            # Layers repeat: a node like one seen before (op, attributes, shapes,
            # small constants, input specs) gets that node's result, renamed.
            memo_key = _memo_key(node, ins, outs, shapes, constants, in_specs)
            hit = memo.get(memo_key) if memo_key is not None else None
            if hit is not None:
                inferred = [renamed(spec, n) if spec is not None and n else None for spec, n in zip(hit[0], outs)]
                notes = _retarget(hit[1], hit[2], ins + outs, node.name)
            else:
                ctx = NodeContext(
                    node,
                    tuple(shapes.get(n) for n in ins),
                    tuple(shapes.get(n) for n in outs),
                    constants,
                    opset,
                )
                try:
                    inferred, notes = rule.propagate(ctx, in_specs)
                except Exception as e:  # a rule bug must not hide every other diagnostic
                    inferred, notes = [None] * len(outs), [_rule_failed(node, e)]
                if memo_key is not None:
                    memo[memo_key] = (inferred, notes, ins + outs)
            if not given:
                # Shape warnings matter where the user wrote specs; elsewhere they are notes.
                notes = [
                    d if d.severity != "warning" else _as_note(d) for d in notes
                ]
        elif rule is None and given:
            why = "it has subgraphs (control flow is outside proposal 0007)" if _has_subgraph(node) else (
                f"no sharding rule for {node.op_type}"
            )
            diags.append(
                Diagnostic(
                    code=codes.UNSUPPORTED_OP,
                    severity="error" if unsupported == "error" else "warning",
                    node=node.name,
                    op_type=node.op_type,
                    message=f"the node is annotated but {why}; written output specs are taken "
                    "as they are, nothing is inferred or checked",
                    hint="remove the annotation, or annotate only the ops around it",
                    given="; ".join(f"{n}: {text(v)}" for n, v in given.items()),
                    expected="no annotation",
                )
            )
        elif rule is None and any(s is not None and sharded_dims(s, None) for s in in_specs):
            diags.append(
                Diagnostic(
                    code=codes.NO_RULE,
                    severity="note",
                    node=node.name,
                    op_type=node.op_type,
                    message=f"sharded data enters {node.op_type}, which has no sharding rule: "
                    "its outputs are left to the compiler",
                )
            )
        diags += notes
        outputs: list[ShardingSpec | None] = []
        reduced = {d.tensor for d in notes if d.code == codes.COLLECTIVE and d.expected == "all-reduce"}
        for name, spec in zip(outs, inferred, strict=False):
            if not name:
                outputs.append(None)
                continue
            written = given.get(name)
            if written is not None:
                if spec is not None:
                    kind = reshard_kind(spec, written, shapes.get(name))
                    kept = kind and in_specs and in_specs[0] is not None and statistics_kept_split(
                        node.op_type, name, notes,
                        reshard_kind(renamed(in_specs[0], name), written, shapes.get(name)) is None)
                    if kept:  # the norm's statistics meet instead of a gather
                        diags.remove(kept[0])
                        diags += kept[1]
                    elif kind is not None:
                        if kind == "dynamic-slice" and name in reduced:
                            kind = "reduce-scatter"
                        diags.append(_reshard_note(node, name, spec, written, kind, "output resharded"))
                spec = written
            elif spec is not None:
                spec = renamed(spec, name)
            outputs.append(spec)
            if spec is not None:
                tensors[name] = spec
        nodes[key] = NodeShardings(
            node=key,
            op_type=node.op_type,
            inputs=tuple(in_specs),
            outputs=tuple(outputs),
            given_inputs=tuple(bool(n) and n in given for n in ins),
            given_outputs=tuple(bool(n) and n in given for n in outs),
        )
    return Inference(config, nodes, tensors, tuple(diags), shapes)


def _rule_failed(node: onnx.NodeProto, error: Exception) -> Diagnostic:
    return Diagnostic(
        code=codes.RULE_FAILED,
        severity="warning",
        node=node.name,
        op_type=node.op_type,
        message=f"the {node.op_type} sharding rule failed ({type(error).__name__}: {error}); "
        "its outputs are left unplaced",
        hint="please report this; the outputs are left to the compiler",
    )


_QUOTED = re.compile(r"'([^']*)'")


def _memo_key(node, ins, outs, shapes, constants, in_specs) -> tuple | None:
    """What a rule's result depends on, or None when names would make reuse ambiguous."""
    names = [n for n in ins + outs if n]
    if len(set(names)) != len(names) or "'" in "".join(names):
        return None
    return (
        node.op_type,
        node.domain,
        tuple(a.SerializeToString() for a in node.attribute),
        tuple(shapes.get(n) for n in ins),
        tuple(shapes.get(n) for n in outs),
        tuple(constants.key(n) if n in constants else bool(n) for n in ins),
        tuple(None if s is None else (s.sharded_dims, s.devices, s.groups) for s in in_specs),
    )


def _retarget(notes, old, new, node: str) -> list[Diagnostic]:
    """Diagnostics of a memoised node, moved to another node with other tensor names."""
    if not notes:
        return []
    mapping = {a: b for a, b in zip(old, new, strict=True) if a}

    def sub(text):
        return None if text is None else _QUOTED.sub(lambda m: repr(mapping.get(m.group(1), m.group(1))), text)

    return [
        dataclasses.replace(
            d,
            node=node,
            tensor=mapping.get(d.tensor, d.tensor),
            message=sub(d.message),
            hint=sub(d.hint),
            given=sub(d.given),
            expected=sub(d.expected),
        )
        for d in notes
    ]


def _as_note(d: Diagnostic) -> Diagnostic:
    return dataclasses.replace(d, severity="note")


def completed_model(model: onnx.ModelProto, inference: Inference) -> onnx.ModelProto:
    """A copy of ``model`` whose nodes carry every spec `infer` knows (written and inferred).

    Nodes without any known spec are left unannotated; pipeline stages are kept.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    config = inference.configuration
    if config is None:
        return out
    for index, node in enumerate(out.graph.node):
        key = node.name or f"{node.op_type}#{index}"
        found = inference.nodes.get(key)
        if found is None:
            continue
        specs = {}
        for name, spec in zip(node.input, found.inputs, strict=False):
            if name and spec is not None:
                specs.setdefault(name, renamed(spec, name))
        for name, spec in zip(node.output, found.outputs, strict=False):
            if name and spec is not None:
                specs.setdefault(name, renamed(spec, name))
        if not specs:
            continue
        stage = None
        keep = []
        for proto in node.device_configurations:
            if proto.configuration_id == config:
                stage = proto.pipeline_stage if proto.HasField("pipeline_stage") else None
            else:
                keep.append(proto)
        del node.device_configurations[:]
        node.device_configurations.extend(keep)
        node.device_configurations.append(NodeConfig(config, tuple(specs.values()), stage).to_proto())
        if not node.name:
            node.name = key
    return out
