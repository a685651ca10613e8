"""The Megatron tensor-parallel plan for transformer graphs.

`megatron_plan` never touches its argument: it returns an annotated **copy**,
written with the builders of `sharding.annotate`. `megatron_layout` is the
pure analysis behind the plan: which MatMul/Gemm/Gather nodes play which
Megatron role, found by graph pattern (never by node or initializer names),
and the specs that follow.

The Megatron plan (docs/annotate.md has the worked example):

* A *linear* is a MatMul or Gemm whose weight is a 2-D initializer, directly
  or through a 2-D Transpose. A linear is **row-parallel** when its activation
  input descends from other linears through anything but a normalisation
  (per-head Reshape/Transpose/Softmax/MatMul between activations, activations,
  the gate product); those linears are **column-parallel**. Normalisations
  (LayerNormalization & co., and decomposed RMS/LayerNorm: a node mixing a
  tensor with a ReduceMean-derived value) end the walk; they are the layer
  boundaries. A pair is *attention* when the walk crossed a MatMul between
  activations or a Softmax, else *MLP*.
* Column: weight split on N, bias split like N, output split on its last
  axis. A column whose output is cut into k equal parts on the feature axis
  (a Split or Slices, through Reshapes; GPT-2's fused q/k/v, a fused gate/up)
  is split through a *fused axis* ``[{k, 1 shard}, {N/k, w shards}]`` so that
  every part is split on its own; one cut into unequal attention parts (q|k|v
  under GQA/MQA) stays replicated and each part is split by its readers
  (`sharding.megatron_parts`). Row: activation and weight split on K, bias
  and output replicated (the one all-reduce of the pair).
* Shard count ``w`` per pair: the largest divisor of ``num_devices`` that
  divides the heads (attention; heads read from the Reshape that splits the
  projection) or the width (MLP). When ``w < num_devices`` each shard lives on
  a group of ``num_devices / w`` consecutive devices. GQA: key/value
  projections with fewer heads than ``w`` are left replicated by default;
  with ``gqa="groups"`` they are split ``gcd(kv_heads, w)`` ways on groups,
  so that device d holds exactly the kv head its query heads read.
* Token embeddings (a Gather on a 2-D initializer whose ids depend on a model
  input's values) are split by vocabulary, output replicated (one
  all-reduce); only the largest such tables count, so position ids computed
  from the token ids (RoBERTa) do not make their small table a split one.
  Position/type tables (ids computed from shapes or constants) stay
  replicated. The LM head (an unpaired linear producing the vocabulary)
  is column-parallel, logits left vocab-sharded; a head tied to the embedding
  table gets the same vocabulary split on that one parameter.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx
import onnx.numpy_helper
import onnx.shape_inference

from .annotate import add_configuration, name_nodes, set_spec
from .megatron_parts import Part, feature_parts
from .model_arg import takes_model
from .spec import ShardedDim, ShardingSpec, SimpleShardedDim, remap_spec

_log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------
# Graph view used by the plan
# ---------------------------------------------------------------------------

_NORM_OPS = frozenset(
    {
        "LayerNormalization",
        "RMSNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "GroupNormalization",
        "InstanceNormalization",
        "BatchNormalization",
        "MeanVarianceNormalization",
        "LpNormalization",
    }
)
# Ops that only carry shapes: a walk along values stops there.
_SHAPE_OPS = frozenset({"Shape", "Size", "ConstantOfShape", "EyeLike"})
# Ops a norm's statistics flow through between the ReduceMean and the apply node.
_STAT_OPS = frozenset(
    {
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Sqrt",
        "Reciprocal",
        "Pow",
        "Cast",
        "Identity",
        "Neg",
        "Max",
        "Min",
        "Clip",
    }
)
_ATTENTION_OPS = frozenset({"Softmax", "MatMul", "Einsum"})

Shape = tuple[int | str | None, ...]


class _Graph:
    """Producers, consumers, constants and inferred shapes of the main graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        graph = model.graph
        self.nodes = list(graph.node)
        self.inits = {i.name: tuple(i.dims) for i in graph.initializer}
        self.init_protos = {i.name: i for i in graph.initializer}
        self.inputs = {i.name for i in graph.input} - set(self.inits)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        self.constants = set(self.inits)
        for index, node in enumerate(self.nodes):
            for name in node.output:
                if name:
                    self.producer[name] = index
            for name in node.input:
                if name:
                    self.consumers[name].append(index)
            if node.op_type == "Constant":
                self.constants.update(node.output)
        self.shapes = self._infer_shapes(model)
        self.norm_nodes = self._norm_nodes()

    def _infer_shapes(self, model: onnx.ModelProto) -> dict[str, Shape]:
        try:
            graph = onnx.shape_inference.infer_shapes(model, data_prop=True).graph
        except Exception as e:  # noqa: BLE001 - shapes only refine the plan
            _log.info("shape inference failed (%s); planning without shapes", e)
            graph = model.graph
        shapes: dict[str, Shape] = {}
        for info in (*graph.input, *graph.output, *graph.value_info):
            tensor_type = info.type.tensor_type
            if tensor_type.HasField("shape"):
                shapes[info.name] = tuple(
                    d.dim_value
                    if d.HasField("dim_value")
                    else d.dim_param
                    if d.HasField("dim_param")
                    else None
                    for d in tensor_type.shape.dim
                )
        shapes.update(self.inits)
        return shapes

    def _norm_nodes(self) -> set[int]:
        """Explicit normalisations, and the nodes applying decomposed ones.

        A decomposed RMSNorm is ``x * Reciprocal(Sqrt(ReduceMean(x^2) + eps))``
        and a decomposed LayerNorm ``(x - ReduceMean(x)) / ...``: the apply node
        mixes a tensor with a value computed from a ReduceMean through
        statistics-only ops (constants as the other operands).
        """
        stats: set[str] = set()
        norms = set()
        for index, node in enumerate(self.nodes):
            if node.op_type in _NORM_OPS:
                norms.add(index)
                continue
            if node.op_type == "ReduceMean":
                stats.update(node.output)
                continue
            inputs = [i for i in node.input if i]
            if not any(i in stats for i in inputs):
                continue
            if node.op_type in _STAT_OPS and all(i in stats or i in self.constants for i in inputs):
                stats.update(node.output)
            else:
                norms.add(index)
        return norms

    def rank(self, tensor: str) -> int | None:
        shape = self.shapes.get(tensor)
        return None if shape is None else len(shape)

    def attr(self, node: onnx.NodeProto, name: str, default=None):
        for a in node.attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def walk_back(self, tensor: str, stop: set[int]) -> tuple[set[int], bool]:
        """Nodes of ``stop`` reached backwards from ``tensor``, and whether
        the walk crossed an attention op (Softmax, MatMul between activations).

        The walk stops at ``stop`` nodes, normalisations, shape-only ops and
        graph inputs/initializers.
        """
        found: set[int] = set()
        attention = False
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            index = self.producer.get(name)
            if index is None:
                continue
            if index in stop:
                found.add(index)
                continue
            node = self.nodes[index]
            if index in self.norm_nodes or node.op_type in _SHAPE_OPS:
                continue
            if node.op_type in _ATTENTION_OPS:
                attention = True
            stack.extend(i for i in node.input if i)
        return found, attention

    def depends_on_input(self, tensor: str) -> bool:
        """Whether a tensor's values depend on a model input (not only its shape)."""
        seen: set[str] = set()
        stack = [tensor]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in self.inputs:
                return True
            index = self.producer.get(name)
            if index is None or self.nodes[index].op_type in _SHAPE_OPS:
                continue
            stack.extend(i for i in self.nodes[index].input if i)
        return False


# ---------------------------------------------------------------------------
# Megatron tensor parallelism
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Linear:
    """A MatMul/Gemm with a 2-D initializer weight.

    Attributes:
        node: The MatMul/Gemm node's name.
        op_type: ``"MatMul"`` or ``"Gemm"``.
        activation: Its activation input (A).
        weight: Its weight input (B), as the node reads it.
        parameter: The initializer behind the weight (the weight itself, or
            the input of the 2-D Transpose producing it).
        transpose: The Transpose node's name when the weight goes through one.
        k_axis: The weight's contraction axis (in ``weight``).
        activation_k_axis: The activation's contraction axis.
        in_features: K.
        out_features: N.
        bias: ``(node, tensor)`` of the bias: Gemm's C, or the Add of a 1-D
            initializer right after a MatMul; None when there is none.
        matmul_output: The MatMul/Gemm node's own output.
        output: The linear's output after its bias (``matmul_output`` when
            the bias is Gemm's C or there is none).
        parts: k when the output is split into k equal parts on the feature
            axis (fused q/k/v or gate/up), else 1.
        heads: Attention heads per part, read from the Reshape that splits
            the feature axis; None when no such Reshape follows.
        uneven: The output is split on the feature axis into unequal (or
            unknown) parts; such a linear is left replicated, and its parts
            (when known) are split by their readers.
        pieces: The parts of an unequal cut, in feature order.
    """

    node: str
    op_type: str
    activation: str
    weight: str
    parameter: str
    transpose: str | None
    k_axis: int
    activation_k_axis: int
    in_features: int
    out_features: int
    bias: tuple[str, str] | None
    matmul_output: str
    output: str
    parts: int = 1
    heads: int | None = None
    uneven: bool = False
    pieces: tuple[Part, ...] = ()

    @property
    def units(self) -> int:
        """What a shard must hold whole: heads when known, else features per part."""
        return self.heads if self.heads is not None else self.out_features // self.parts


@dataclass(frozen=True)
class LinearPair:
    """Column-parallel linears feeding one row-parallel linear.

    Attributes:
        kind: ``"attention"`` or ``"mlp"``.
        layer: Index of the transformer block (attention pairs open a block).
        columns: Names of the column-parallel linears, in graph order.
        row: Name of the row-parallel linear.
        ways: Shards of the pair's sharded axis (heads or width); 1 when
            the pair is left replicated.
        column_ways: Per column, its shard count (fewer for GQA's k/v; 1
            when left replicated).
    """

    kind: str
    layer: int
    columns: tuple[str, ...]
    row: str
    ways: int
    column_ways: tuple[int, ...]


@dataclass(frozen=True)
class Embedding:
    """A Gather on a 2-D initializer table.

    Attributes:
        node: The Gather node's name.
        table: The table initializer.
        vocab: Rows of the table.
        token: Whether its ids depend on a model input (token ids), as opposed
            to positions/types computed from shapes or constants.
        ways: Vocabulary shards; None when the table stays replicated.
    """

    node: str
    table: str
    vocab: int
    token: bool
    ways: int | None


@dataclass(frozen=True)
class Assignment:
    """One spec the plan writes: on which node, in which role."""

    node: str
    spec: ShardingSpec
    role: str


@dataclass(frozen=True)
class MegatronLayout:
    """What `megatron_layout` found and decided.

    Attributes:
        num_devices: Devices of the tensor-parallel group.
        linears: Every linear found, in graph order.
        pairs: Column/row pairs, in graph order.
        embeddings: Every embedding lookup found.
        lm_head: The LM head's node name, or None.
        assignments: The specs to write, node by node.
        notes: Choices worth telling a user (fewer shards, replicated parts).
    """

    num_devices: int
    linears: tuple[Linear, ...]
    pairs: tuple[LinearPair, ...]
    embeddings: tuple[Embedding, ...]
    lm_head: str | None
    assignments: tuple[Assignment, ...]
    notes: tuple[str, ...]

    def roles(self) -> dict[str, str]:
        """Role of each annotated node, e.g. ``{"node_linear": "L0 attention column"}``."""
        result: dict[str, str] = {}
        for a in self.assignments:
            result.setdefault(a.node, a.role)
        return result


def _weight_of(graph: _Graph, node: onnx.NodeProto) -> tuple[str, str | None] | None:
    """``(parameter, transpose node)`` when input B is a 2-D initializer, possibly transposed."""
    if len(node.input) < 2:
        return None
    weight = node.input[1]
    if len(graph.inits.get(weight, ())) == 2:
        return weight, None
    index = graph.producer.get(weight)
    if index is None:
        return None
    producer = graph.nodes[index]
    if producer.op_type != "Transpose" or len(graph.inits.get(producer.input[0], ())) != 2:
        return None
    if list(graph.attr(producer, "perm", [1, 0])) != [1, 0]:
        return None
    return producer.input[0], producer.name


def _find_linear(graph: _Graph, index: int) -> Linear | None:
    node = graph.nodes[index]
    if node.op_type not in ("MatMul", "Gemm"):
        return None
    found = _weight_of(graph, node)
    if found is None:
        return None
    parameter, transpose = found
    param_shape = graph.inits[parameter]
    weight_shape = param_shape[::-1] if transpose else param_shape
    bias = None
    if node.op_type == "Gemm":
        trans_b = graph.attr(node, "transB", 0)
        k_axis = 1 if trans_b else 0
        act_k = 0 if graph.attr(node, "transA", 0) else 1
        if len(node.input) > 2 and node.input[2]:
            bias = (node.name, node.input[2])
    else:
        k_axis, act_k = 0, -1
    in_features = weight_shape[k_axis]
    out_features = weight_shape[1 - k_axis]
    output = node.output[0]
    if bias is None:
        consumers = graph.consumers.get(output, [])
        if len(consumers) == 1:
            add = graph.nodes[consumers[0]]
            other = [i for i in add.input if i != output]
            if (
                add.op_type == "Add"
                and len(other) == 1
                and graph.inits.get(other[0]) == (out_features,)
            ):
                bias = (add.name, other[0])
                output = add.output[0]
    return Linear(
        node=node.name,
        op_type=node.op_type,
        activation=node.input[0],
        weight=node.input[1],
        parameter=parameter,
        transpose=transpose,
        k_axis=k_axis,
        activation_k_axis=act_k,
        in_features=in_features,
        out_features=out_features,
        bias=bias,
        matmul_output=node.output[0],
        output=output,
    )


def _devices(ways: int, num_devices: int) -> list:
    """Shard i on device i, or on the i-th group of ``num_devices // ways`` consecutive devices.

    E.g. 4 ways over 8 devices: ``[{0,1}, {2,3}, {4,5}, {6,7}]``.
    """
    if ways == num_devices:
        return list(range(num_devices))
    group = num_devices // ways
    return [range(i * group, (i + 1) * group) for i in range(ways)]


def _split(
    tensor: str, axis: int, ways: int, num_devices: int, fused: int = 1, size: int = 0
) -> ShardingSpec:
    """``axis`` in ``ways`` shards; with ``fused=k`` the axis (of ``size``) is k parts, each cut."""
    spec = ShardingSpec.split(tensor, {axis: ways}, _devices(ways, num_devices))
    if fused == 1:
        return spec
    # Fused axis: sub-axes [k, size/k], only the inner one cut. With k=3,
    # size=192, ways=8: device d holds columns [8d, 8d+8) of each 64-wide part.
    dim = ShardedDim(
        axis,
        (SimpleShardedDim(1, dim_value=fused), SimpleShardedDim(ways, dim_value=size // fused)),
    )
    return dataclasses.replace(spec, sharded_dims=(dim,))


def _replicated(tensor: str, num_devices: int) -> ShardingSpec:
    return ShardingSpec.replicated(tensor, range(num_devices))


def _column_specs(lin: Linear, ways: int, n: int, role: str) -> list[Assignment]:
    def cut(tensor: str, axis: int) -> ShardingSpec:
        return _split(tensor, axis, ways, n, lin.parts, lin.out_features)

    n_axis = 1 - lin.k_axis
    out = [
        Assignment(lin.node, _replicated(lin.activation, n), role),
        Assignment(lin.node, cut(lin.weight, n_axis), role),
    ]
    if lin.transpose:  # the parameter [N, K] or [K, N] behind the Transpose
        out.append(Assignment(lin.transpose, cut(lin.parameter, lin.k_axis), role))
        out.append(Assignment(lin.transpose, cut(lin.weight, n_axis), role))
    if lin.bias is not None and lin.bias[0] == lin.node:  # Gemm's C: [N], [1, N] or [M, N]
        out.append(Assignment(lin.node, cut(lin.bias[1], -1), role))
    out.append(Assignment(lin.node, cut(lin.matmul_output, -1), role))
    if lin.bias is not None and lin.bias[0] != lin.node:  # MatMul + Add(bias)
        out.append(Assignment(lin.bias[0], cut(lin.matmul_output, -1), role))
        out.append(Assignment(lin.bias[0], cut(lin.bias[1], 0), role))
        out.append(Assignment(lin.bias[0], cut(lin.output, -1), role))
    return out


def _row_specs(lin: Linear, ways: int, n: int, role: str) -> list[Assignment]:
    out = [
        Assignment(lin.node, _split(lin.activation, lin.activation_k_axis, ways, n), role),
        Assignment(lin.node, _split(lin.weight, lin.k_axis, ways, n), role),
    ]
    if lin.transpose:
        out.append(Assignment(lin.transpose, _split(lin.parameter, 1 - lin.k_axis, ways, n), role))
        out.append(Assignment(lin.transpose, _split(lin.weight, lin.k_axis, ways, n), role))
    if lin.bias is not None and lin.bias[0] == lin.node:
        out.append(Assignment(lin.node, _replicated(lin.bias[1], n), role))
    out.append(Assignment(lin.node, _replicated(lin.matmul_output, n), role))
    if lin.bias is not None and lin.bias[0] != lin.node:
        for tensor in (lin.matmul_output, lin.bias[1], lin.output):
            out.append(Assignment(lin.bias[0], _replicated(tensor, n), role))
    return out


def _col_heads(col: Linear) -> bool:
    if col.uneven:
        return bool(col.pieces) and all(p.heads for p in col.pieces)
    return bool(col.heads)


def _col_units(col: Linear, use_heads: bool) -> int:
    """What a shard of the column must hold whole, for its largest part."""
    if col.uneven:
        return max((p.heads if use_heads else p.width) for p in col.pieces) if col.pieces else 1
    return col.heads if use_heads else col.out_features // col.parts


def _piece_specs(
    graph: _Graph, col: Linear, ways: int, n: int, use_heads: bool, gqa: str, layer: int,
    kind: str, notes: list[str],
) -> list[Assignment]:
    """A fused projection cut into unequal parts: the projection stays replicated, each part
    is cut out replicated, and its readers take it split by heads (a local slice of a
    replicated tensor, no collective). Splitting the Split/Slice outputs themselves would
    let XLA shard the fused tensor evenly first and shift the parts into place with
    collective-permutes."""
    role = f"L{layer} {kind} part"
    what = "heads" if use_heads else "features"
    out: list[Assignment] = []
    split = []
    for piece in col.pieces:
        units = piece.heads if use_heads else piece.width
        pw = math.gcd(units, ways)
        if pw < ways and gqa == "replicate":
            notes.append(
                f"layer {layer} {kind}: part {piece.tensor!r} of {col.node} has {units} {what} "
                f"(GQA), fewer than {ways} shards; left replicated"
            )
            continue
        if pw == 1:
            continue
        split.append(piece.tensor)
        out.append(Assignment(piece.node, _replicated(piece.source, n), role))
        out.append(Assignment(piece.node, _replicated(piece.tensor, n), role))
        for index in graph.consumers.get(piece.tensor, []):
            reader = graph.nodes[index].name
            out.append(Assignment(reader, _split(piece.tensor, -1, pw, n), role))
    notes.append(
        f"layer {layer} {kind}: {col.node} is cut into unequal parts "
        f"{[p.width for p in col.pieces]}; no split of its weight gives every device matching "
        f"parts, so it stays replicated and {split} are split by their readers"
    )
    return out


def _check_devices(num_devices: int) -> None:
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be an int >= 1, got {num_devices!r}")


_GQA_CHOICES = ("replicate", "groups")


@takes_model()
def megatron_layout(
    model: onnx.ModelProto, num_devices: int, *, gqa: str = "replicate"
) -> MegatronLayout:
    """Finds the Megatron tensor-parallel roles of a transformer graph, by pattern.

    Pure analysis: the model is not modified. See the module docstring for
    the patterns and the choices; `megatron_plan` writes the result.

    Args:
        model: A transformer graph (torch exports of Llama, GPT-2, BERT...).
        num_devices: Devices of the tensor-parallel group.
        gqa: Key/value projections with fewer heads than the pair's shard
            count: ``"replicate"`` leaves them unannotated (replicated, as
            inference completes them); ``"groups"`` splits them by kv heads,
            each shard on the group of devices whose query heads read it
            (vLLM's kv-head replicas: less memory, no extra communication).

    Returns:
        The `MegatronLayout`: pairs, embeddings, LM head, specs and notes.

    Raises:
        ValueError: ``num_devices`` < 1, or a node to annotate has no name.
    """
    _check_devices(num_devices)
    if gqa not in _GQA_CHOICES:
        raise ValueError(f"gqa must be one of {_GQA_CHOICES}, got {gqa!r}")
    n = num_devices
    graph = _Graph(model)
    notes: list[str] = []

    linears: dict[int, Linear] = {}
    for index in range(len(graph.nodes)):
        lin = _find_linear(graph, index)
        if lin is None:
            continue
        cut = feature_parts(graph, lin.output, lin.out_features)
        if cut.parts == 0:
            linears[index] = dataclasses.replace(lin, uneven=True, pieces=cut.pieces)
            continue
        linears[index] = dataclasses.replace(lin, parts=cut.parts, heads=cut.heads)

    # Pairs: a linear whose activation descends from other linears is a row.
    role: dict[int, str] = {}
    raw_pairs: list[tuple[list[int], int, bool]] = []
    for index, lin in linears.items():
        sources, attention = graph.walk_back(lin.activation, set(linears))
        if not sources:
            continue
        rows = sorted(s for s in sources if role.get(s) == "row")
        if rows:
            notes.append(
                f"{lin.node}: fed by row-parallel {[linears[s].node for s in rows]} "
                "without a normalisation between; left replicated"
            )
            continue
        role[index] = "row"
        for source in sources:
            role[source] = "column"
        raw_pairs.append((sorted(sources), index, attention))

    assignments: list[Assignment] = []
    pairs: list[LinearPair] = []
    layer, previous = -1, None
    for sources, index, attention in raw_pairs:
        kind = "attention" if attention else "mlp"
        if kind == "attention" or previous != "attention":
            layer += 1
        previous = kind
        cols = [linears[s] for s in sources]
        row = linears[index]
        use_heads = attention and all(_col_heads(c) for c in cols)
        units = [_col_units(c, use_heads) for c in cols]
        ways = math.gcd(max(units), n)
        col_ways = [math.gcd(u, ways) for u in units]
        what = "heads" if use_heads else "features"
        unknown = [c.node for c in cols if c.uneven and not (c.pieces and use_heads)]
        if unknown:
            ways, col_ways = 1, [1] * len(cols)
            notes.append(
                f"layer {layer} {kind} ({row.node}): {unknown} split their output into unequal "
                "parts of unknown sizes or heads (no fused axis describes that); left replicated"
            )
        elif ways == 1 or row.in_features % ways:
            ways, col_ways = 1, [1] * len(cols)
            if n > 1:
                notes.append(
                    f"layer {layer} {kind} ({row.node}): {what} {units} share no divisor "
                    f"with {n} devices; left replicated"
                )
        else:
            if ways < n:
                notes.append(
                    f"layer {layer} {kind}: {what} {max(units)} split {ways} ways, each shard "
                    f"on {n // ways} devices"
                )
            for position, (col, cw, u) in enumerate(zip(cols, col_ways, units)):
                if col.uneven:
                    col_ways[position] = 1
                    assignments += _piece_specs(graph, col, ways, n, use_heads, gqa, layer, kind, notes)
                    continue
                if cw < ways and gqa == "replicate":
                    col_ways[position] = 1
                    notes.append(
                        f"layer {layer} {kind}: {col.node} has {u} {what} (GQA), fewer than "
                        f"{ways} shards; left replicated (gqa='groups' splits it {cw} ways)"
                    )
                    continue
                if cw < ways:
                    notes.append(
                        f"layer {layer} {kind}: {col.node} has {u} {what} (GQA); split {cw} "
                        f"ways, each shard on the {n // cw} devices whose query heads read it"
                    )
                assignments += _column_specs(col, cw, n, f"L{layer} {kind} column")
            assignments += _row_specs(row, ways, n, f"L{layer} {kind} row")
        pairs.append(
            LinearPair(kind, layer, tuple(c.node for c in cols), row.node, ways, tuple(col_ways))
        )

    # Embeddings: token tables split by vocabulary; position/type tables replicated.
    # Position ids may be computed from the token ids (RoBERTa: a CumSum over the
    # non-padding tokens); only the largest input-dependent tables are token tables,
    # a vocabulary split of a small table would cost an all-reduce to save little.
    embeddings: list[Embedding] = []
    token_tables: dict[str, int] = {}
    lookups = [
        node
        for node in graph.nodes
        if node.op_type == "Gather"
        and len(graph.inits.get(node.input[0], ())) == 2
        and graph.attr(node, "axis", 0) == 0
    ]
    dependent = {node.name: graph.depends_on_input(node.input[1]) for node in lookups}
    largest = max((graph.inits[x.input[0]][0] for x in lookups if dependent[x.name]), default=0)
    for node in lookups:
        table = node.input[0]
        vocab = graph.inits[table][0]
        token = dependent[node.name] and vocab == largest
        ways = math.gcd(vocab, n) if token else None
        if token and ways == 1:
            if n > 1:
                notes.append(
                    f"{node.name}: vocabulary {vocab} shares no divisor with {n}; replicated"
                )
            ways = None
        if dependent[node.name] and not token:
            notes.append(
                f"{node.name}: ids computed from the inputs, but its {vocab} rows are fewer than "
                f"the token vocabulary's {largest} (positions, types); table replicated, a "
                "vocabulary split would cost an all-reduce"
            )
        elif not token:
            notes.append(
                f"{node.name}: ids computed from shapes/constants (positions, types); "
                "table replicated"
            )
        embeddings.append(Embedding(node.name, table, vocab, token, ways))
        if token:
            token_tables[table] = ways or 1
        if ways is not None:
            role_name = "embedding (vocab)"
            assignments += [
                Assignment(node.name, _split(table, 0, ways, n), role_name),
                Assignment(node.name, _replicated(node.input[1], n), role_name),
                Assignment(node.name, _replicated(node.output[0], n), role_name),
            ]

    # LM head: an unpaired linear producing the vocabulary.
    lm_head = None
    vocabs = {graph.inits[t][0]: w for t, w in token_tables.items()}
    for index, lin in linears.items():
        if index in role:
            continue
        ways = token_tables.get(lin.parameter) or vocabs.get(lin.out_features)
        if lm_head is None and ways is not None:
            lm_head = lin.node
            tied = " (tied)" if lin.parameter in token_tables else ""
            if ways > 1:
                assignments += _column_specs(lin, ways, n, "LM head column" + tied)
            elif n > 1:
                notes.append(f"{lin.node}: LM head; vocabulary shares no divisor with {n}; replicated")
        else:
            notes.append(f"{lin.node}: linear outside any column/row pair; left replicated")

    unnamed = sorted({a.node for a in assignments if not a.node})
    if unnamed:
        raise ValueError("nodes to annotate have no name; name them (megatron_plan does)")
    _log.info("megatron layout on %d devices: %d pairs, notes: %s", n, len(pairs), notes)
    return MegatronLayout(
        num_devices=n,
        linears=tuple(linears.values()),
        pairs=tuple(pairs),
        embeddings=tuple(embeddings),
        lm_head=lm_head,
        assignments=tuple(assignments),
        notes=tuple(notes),
    )


@takes_model()
def megatron_plan(
    model: onnx.ModelProto,
    num_devices: int,
    configuration: str = "tp",
    *,
    gqa: str = "replicate",
    node_devices: Mapping[str, Sequence[int]] | None = None,
) -> onnx.ModelProto:
    """A copy of ``model`` annotated for Megatron tensor parallelism.

    Adds the configuration (``num_devices`` devices) when missing and writes,
    for every node `megatron_layout` assigns a role, a spec for each of its
    inputs and outputs; everything else is left for inference. Unnamed or
    duplicate-named nodes of the copy are given unique names first.

    Args:
        model: The model (a ModelProto, a path or an onnx_ir.Model, which gets an
            onnx_ir.Model back); not modified.
        num_devices: Devices of the tensor-parallel group.
        configuration: Name of the `DeviceConfigurationProto` to use.
        gqa: What to do with key/value projections that have fewer heads than
            the shard count; see `megatron_layout`.
        node_devices: Tensor parallelism inside device groups (one per
            pipeline stage, say): node -> the ``num_devices`` configuration
            devices of its group. The plan is made for ``num_devices`` and
            each node's specs are moved onto its group; the configuration
            gets as many devices as the groups use. Default: every node on
            devices ``0..num_devices-1``.

    Returns:
        The annotated copy. `describe_plan` lists what was written.

    Raises:
        ValueError: ``num_devices`` < 1, or the configuration exists with
            another number of devices.

    Example:
        >>> annotated = megatron_plan(onnx.load("tiny_llama.onnx"), 8)  # doctest: +SKIP
        >>> describe_plan(annotated)[0]  # doctest: +SKIP
        PlanRow(configuration='tp', node='node_embedding', op_type='Gather', ...)
    """
    _check_devices(num_devices)
    result = copy.deepcopy(model)
    name_nodes(result)
    layout = megatron_layout(result, num_devices, gqa=gqa)
    if node_devices is None:
        add_configuration(result, configuration, num_devices)
        for assignment in layout.assignments:
            set_spec(result, assignment.node, assignment.spec, configuration)
        return result
    wrong = sorted({len(g) for g in node_devices.values()} - {num_devices})
    if wrong:
        raise ValueError(f"node_devices: every group must have num_devices={num_devices} devices, got sizes {wrong}")
    add_configuration(result, configuration, max(d for g in node_devices.values() for d in g) + 1)
    for assignment in layout.assignments:
        if assignment.node not in node_devices:
            raise ValueError(f"node_devices has no group for node {assignment.node!r}")
        group = dict(enumerate(node_devices[assignment.node]))
        set_spec(result, assignment.node, remap_spec(assignment.spec, group), configuration)
    return result


__all__ = [
    "Assignment",
    "Embedding",
    "Linear",
    "LinearPair",
    "MegatronLayout",
    "megatron_layout",
    "megatron_plan",
]
