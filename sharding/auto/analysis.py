"""A candidate plan evaluated as data: specs as a mapping over one shape-inferred graph.

`PlanAnalysis` reads a model once: it names its nodes (the one copy made),
runs ONNX shape inference once at the workload's shapes, and indexes the graph
(`sharding.megatron.graph.PlanGraph`). `PlanAnalysis.evaluate` then takes a
candidate's specs as a mapping ``{node: NodeConfig}`` and runs sharding
inference over that same graph (`sharding.infer.infer_graph` with ``written=``): no
ModelProto is copied and no shape inference runs per candidate. What it gives
back (`Evaluation`):

* the collectives inference predicts (its ``collective`` and ``reshard``
  notes), each with the bytes of its per-device result: an all-reduce's or an
  all-gather's result buffer, the tensor as each device holds it after the
  collective. This is what `onnx2jax.runtime.auto_check` reads off the
  compiled HLO (each collective's result shape), so the two compare one to
  one;
* the parameter bytes each device holds: one copy of each parameter (float
  initializers, and large integer ones) per
  distinct layout its readers ask (the spec written for the reader, else the
  whole tensor on every device), as the runtime places parameters;
* the FLOPs of the products (MatMul, Gemm, Conv) the busiest device runs,
  and its activation bytes (the largest tensor and the sum of all of them).

`write_plan` writes the winner's specs into a copy of the model, once.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from sharding import codes
from sharding.annotate import add_configuration, name_nodes
from sharding.infer import infer_graph, reshard_note_kind
from sharding.inference import Inference
from sharding.megatron.graph import PlanGraph
from sharding.megatron.specs import Assignment
from sharding.model_configs import NodeConfig
from sharding.shapes import infer_model
from sharding.spec import ShardingSpec

STATIC_LIMIT = 4096
"""An integer initializer of at most this many elements is a constant folded into the program, not a
parameter placed on devices (the runtime's rule: ``onnx2jax.translate.STATIC_INITIALIZER_LIMIT``)."""

_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                          onnx.TensorProto.BFLOAT16, onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128}
                         | {getattr(onnx.TensorProto, n) for n in dir(onnx.TensorProto) if n.startswith("FLOAT8")})

CONFIGURATION = "auto"
"""The device configuration an automatic plan writes."""

KINDS = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


@dataclass(frozen=True)
class Collective:
    """One collective inference predicts.

    Attributes:
        kind: ``all-reduce``, ``all-gather``...
        node: The ONNX node it runs at.
        tensor: The tensor it produces (or reshards).
        bytes: Bytes of its result on one device.
        group: Devices taking part in one instance of it (the shards that meet).
    """

    kind: str
    node: str
    tensor: str
    bytes: int
    group: int


@dataclass(frozen=True)
class Evaluation:
    """What a candidate's specs give on the analysed graph (see the module docstring)."""

    collectives: tuple[Collective, ...]
    param_bytes: dict[int, int]
    flops: int
    activation_peak: int
    activation_total: int
    errors: tuple[str, ...]
    inference: Inference | None = field(default=None, repr=False, compare=False)

    @property
    def collective_bytes(self) -> int:
        """Bytes of every collective's per-device result, summed."""
        return sum(c.bytes for c in self.collectives)

    @property
    def max_param_bytes(self) -> int:
        """Parameter bytes on the device holding the most."""
        return max(self.param_bytes.values(), default=0)

    def counts(self) -> dict[str, int]:
        """Collectives by kind (every kind listed, zeros included)."""
        out = dict.fromkeys(KINDS, 0)
        for c in self.collectives:
            out[c.kind] += 1
        return out


def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


class PlanAnalysis:
    """One model, read once, against which candidate specs are evaluated (module docstring).

    Args:
        model: The model; not modified (its nodes are named on the one copy kept here).
        input_shapes: Concrete dims of the model inputs (the workload's batch and sequence).
    """

    def __init__(self, model: onnx.ModelProto, input_shapes: Mapping[str, list[int]] | None = None) -> None:
        self.input_shapes = dict(input_shapes or {})
        self.model = onnx.ModelProto()
        self.model.CopyFrom(model)
        name_nodes(self.model)
        inferred = infer_model(self.model, input_shapes)
        symbols = _symbols(self.model, input_shapes or {})
        self.shapes = {name: _resolved(shape, symbols) for name, shape in inferred.shapes.items()}
        self.shape_diagnostics = list(inferred.diagnostics)
        self.graph = PlanGraph(self.model, self.shapes)
        self._by_name = {node.name: node for node in self.model.graph.node}
        self.itemsize = {name: _itemsize(info.type.tensor_type.elem_type)
                         for name, info in inferred.value_types(self.model).items()
                         if info.type.HasField("tensor_type")}
        self.initializers = {i.name: i for i in self.model.graph.initializer}
        self.parameters = [name for name, i in self.initializers.items()
                           if i.data_type in _FLOAT_TYPES or math.prod(i.dims) > STATIC_LIMIT]
        for name, init in self.initializers.items():
            self.itemsize[name] = _itemsize(init.data_type)
        self.param_total = sum(self._nbytes(name, self.shapes.get(name)) for name in self.parameters)
        self._regions: dict[tuple, dict[int, int]] = {}
        self._readers = {name: [self.graph.nodes[i].name for i in self.graph.consumers.get(name, [])]
                         for name in self.parameters}
        whole = {name: self._nbytes(name, shape) for name, shape in self.shapes.items() if name not in self.initializers}
        self._activations_whole = sorted(whole.items(), key=lambda item: -item[1])
        self._activations_total = sum(whole.values())

    def _nbytes(self, tensor: str, shape) -> int:
        if not shape or any(not isinstance(d, int) for d in shape):
            return 0 if shape is None or shape else self.itemsize.get(tensor, 4)
        return math.prod(shape) * self.itemsize.get(tensor, 4)

    def per_device(self, spec: ShardingSpec | None, tensor: str, num_devices: int) -> dict[int, int]:
        """Bytes of ``tensor`` each device holds under ``spec`` (None: whole on every device)."""
        shape = self.shapes.get(tensor)
        total = self._nbytes(tensor, shape)
        if spec is None or not spec.sharded_dims:
            devices = range(num_devices) if spec is None else spec.all_devices()
            return dict.fromkeys(devices, total)
        key = (spec.sharded_dims, spec.devices, spec.groups, shape)
        found = self._regions.get(key)
        if found is None:
            found = {}
            for shard in range(spec.num_shards):
                for device in spec.devices_of_shard(shard):
                    found[device] = found.get(device, 0) + total // spec.num_shards
            self._regions[key] = found
        return found

    def evaluate(self, written: Mapping[str, NodeConfig] | Iterable[Assignment], num_devices: int) -> Evaluation:
        """Runs inference with ``written`` as the model's annotations and measures the result.

        Args:
            written: ``{node: NodeConfig}`` (configuration `CONFIGURATION`), or the
                `Assignment`s of a layout (the last spec of a tensor on a node wins,
                as `set_spec` would leave it).
            num_devices: Devices of the configuration.
        """
        if not isinstance(written, Mapping):
            written = node_configs(written)
        inference = infer_graph(self.model, CONFIGURATION, shapes=(self.shapes, []), written=written)
        errors = tuple(f"{d.node}: {d.message}" for d in inference.errors())
        return Evaluation(
            collectives=tuple(self.collectives(inference)),
            param_bytes=self.param_bytes(written, num_devices),
            flops=self.flops(inference),
            activation_peak=self.activations(inference, max),
            activation_total=self.activations(inference, sum),
            errors=errors,
            inference=inference,
        )

    def collectives(self, inference: Inference) -> Iterable[Collective]:
        """Every collective ``inference`` predicts (its ``collective`` and ``reshard`` notes)."""
        for d in inference.diagnostics:
            if d.code == codes.COLLECTIVE and d.expected in KINDS:
                kinds = [d.expected]
            elif d.code == codes.RESHARD:
                kinds = [k for k in reshard_note_kind(d).split(" + ") if k in KINDS]
            else:
                continue
            for kind in kinds:
                yield self._collective(inference, kind, d.node, d.tensor)

    def _collective(self, inference: Inference, kind: str, node: str, tensor: str | None) -> Collective:
        found = inference.nodes.get(node)
        spec = inference.tensors.get(tensor) if tensor else None
        if found is not None and tensor:  # the spec the node leaves (or asks) for the tensor
            outs = dict(zip(self._outputs(node), found.outputs))
            ins = dict(zip(self._inputs(node), found.inputs))
            spec = outs.get(tensor) or ins.get(tensor) or spec
        group = max((s.num_shards for s in (found.inputs if found else ()) if s is not None), default=1)
        if spec is None or tensor is None:
            return Collective(kind, node, tensor or "", 0, group)
        per = self.per_device(spec, tensor, 1)
        return Collective(kind, node, tensor, max(per.values(), default=0), max(group, 2))

    def _inputs(self, node: str) -> list[str]:
        return list(self._by_name[node].input)

    def _outputs(self, node: str) -> list[str]:
        return list(self._by_name[node].output)

    def param_bytes(
        self,
        written: Mapping[str, NodeConfig],
        num_devices: int,
        reader_devices: Mapping[str, tuple[int, ...]] | None = None,
    ) -> dict[int, int]:
        """Parameter bytes per device under ``written``, with no inference: a parameter's layout on a
        reader is the spec written for it there, else the whole tensor on the reader's devices
        (``reader_devices``: a pipeline stage's) or on every device."""
        per_device = dict.fromkeys(range(num_devices), 0)
        for name in self.parameters:
            layouts: dict[tuple, dict[int, int]] = {}
            for reader in self._readers[name]:
                config = written.get(reader)
                spec = config.spec_for(name) if config is not None else None
                if spec is None and reader_devices and reader in reader_devices:
                    spec = ShardingSpec.replicated(name, reader_devices[reader])
                key = (None,) if spec is None else (spec.sharded_dims, spec.devices, spec.groups)
                if key not in layouts:
                    layouts[key] = self.per_device(spec, name, num_devices)
            for layout in layouts.values():
                for device, size in layout.items():
                    per_device[device] = per_device.get(device, 0) + size
        return per_device

    def flops(self, inference: Inference) -> int:
        """FLOPs of the products on one device: 2 x its output elements x its share of the reduced axis."""
        total = 0
        for node in self.graph.nodes:
            if node.op_type not in ("MatMul", "Gemm", "Conv") or len(node.input) < 2:
                continue
            a, b, out = self.shapes.get(node.input[0]), self.shapes.get(node.input[1]), self.shapes.get(node.output[0])
            if not (a and b and out) or any(not isinstance(d, int) for d in (*a, *b, *out)):
                continue
            found = inference.nodes.get(node.name)
            a_spec = found.inputs[0] if found else None
            out_spec = found.outputs[0] if found else None
            if node.op_type == "Conv":
                reduced, axis = math.prod(b[1:]), 1
            elif node.op_type == "Gemm":
                trans_a = any(x.name == "transA" and x.i for x in node.attribute)
                reduced, axis = a[0 if trans_a else 1], 0 if trans_a else 1
            else:
                reduced, axis = a[-1], len(a) - 1
            k_ways = _ways(a_spec, axis, len(a))
            out_ways = out_spec.num_shards if out_spec is not None else 1
            total += 2 * math.prod(out) * reduced // max(out_ways * k_ways, 1)
        return total

    def activations(self, inference: Inference, combine) -> int:
        """Per device, the bytes of each activation (placed: its spec's share; unplaced: whole), combined."""
        placed = {name: max(self.per_device(spec, name, 1).values(), default=0)
                  for name, spec in inference.tensors.items() if name not in self.initializers}
        if combine is sum:
            whole = dict(self._activations_whole)
            return self._activations_total - sum(whole.get(n, 0) for n in placed) + sum(placed.values())
        largest_unplaced = next((size for name, size in self._activations_whole if name not in placed), 0)
        return max(largest_unplaced, max(placed.values(), default=0))


def _symbols(model: onnx.ModelProto, input_shapes: Mapping[str, list[int]]) -> dict[str, int]:
    """The inputs' symbolic dim names bound to the sizes ``input_shapes`` gives them."""
    found = {}
    for value in model.graph.input:
        sizes = input_shapes.get(value.name)
        if sizes is None or not value.type.HasField("tensor_type"):
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, sizes):
            if dim.HasField("dim_param") and isinstance(size, int):
                found[dim.dim_param] = size
    return found


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not an integer expression")


def _resolved(shape, symbols: Mapping[str, int]):
    """``shape`` with each symbolic dim that is an expression of bound symbols (``(samples//20) - 1``) computed."""
    if not shape or not symbols or all(not isinstance(d, str) for d in shape):
        return shape
    out = []
    for dim in shape:
        if isinstance(dim, str):
            text = _NAME.sub(lambda m: str(symbols[m.group(0)]) if m.group(0) in symbols else m.group(0), dim)
            try:
                dim = _evaluate(ast.parse(text, mode="eval").body)
            except (SyntaxError, ValueError, ZeroDivisionError):
                pass
        out.append(dim)
    return tuple(out)


def _ways(spec: ShardingSpec | None, axis: int, rank: int) -> int:
    if spec is None:
        return 1
    for dim in spec.sharded_dims:
        if dim.axis % rank == axis:
            return dim.num_shards
    return 1


def node_configs(assignments: Iterable[Assignment]) -> dict[str, NodeConfig]:
    """``{node: NodeConfig}`` of `CONFIGURATION` from assignments (a tensor's last spec on a node wins)."""
    by_node: dict[str, dict[str, ShardingSpec]] = {}
    for a in assignments:
        by_node.setdefault(a.node, {})[a.spec.tensor_name] = a.spec
    return {node: NodeConfig(CONFIGURATION, tuple(specs.values())) for node, specs in by_node.items()}


def write_plan(analysis: PlanAnalysis, written: Mapping[str, NodeConfig], num_devices: int) -> onnx.ModelProto:
    """The analysed model (nodes named) with ``written`` as its configuration `CONFIGURATION`: the one copy written."""
    out = onnx.ModelProto()
    out.CopyFrom(analysis.model)
    add_configuration(out, CONFIGURATION, num_devices)
    for node in out.graph.node:
        config = written.get(node.name)
        if config is None or not config.specs:
            continue
        kept = [c for c in node.device_configurations if c.configuration_id != CONFIGURATION]
        del node.device_configurations[:]
        node.device_configurations.extend(kept)
        node.device_configurations.append(config.to_proto())
    return out
