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
  (`sharding.megatron.parts`). Row: activation and weight split on K, bias
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

Modules: `sharding.megatron.graph` (the graph view and its walks),
`sharding.megatron.linears` (linears and their pairing),
`sharding.megatron.parts` (fused projections' parts),
`sharding.megatron.pairs` (shard counts and specs per pair),
`sharding.megatron.embeddings` (embeddings and the LM head),
`sharding.megatron.builder` (onnxruntime-genai's ops: MatMulNBits, GroupQueryAttention),
`sharding.megatron.cache` (torch exports' past_key_values),
`sharding.megatron.specs` (the spec builders); this module assembles the
layout and writes the plan.
"""


from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import onnx

from sharding.annotate import add_configuration, name_nodes, set_specs
from sharding.megatron.cache import cache_assignments
from sharding.megatron.convs import ConvPair, conv_pair_assignments, conv_pairs
from sharding.megatron.data import data_parallel
from sharding.megatron.embeddings import Embedding, embedding_assignments, lm_head_assignments
from sharding.megatron.graph import PlanGraph
from sharding.megatron.linears import Linear, find_linears, pair_linears
from sharding.megatron.pairs import LinearPair, pair_assignments
from sharding.megatron.specs import Assignment
from sharding.model_arg import takes_model
from sharding.spec import remap_spec

_log = logging.getLogger(__name__)


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
        notes: Choices worth telling a user (fewer shards, replicated parts,
            each layer left whole and why).
        conv_pairs: Channel-parallel Conv pairs (column conv -> per-channel
            ops -> row conv), in graph order.
    """

    num_devices: int
    linears: tuple[Linear, ...]
    pairs: tuple[LinearPair, ...]
    embeddings: tuple[Embedding, ...]
    lm_head: str | None
    assignments: tuple[Assignment, ...]
    notes: tuple[str, ...]
    conv_pairs: tuple[ConvPair, ...] = ()

    def roles(self) -> dict[str, str]:
        """Role of each annotated node, e.g. ``{"node_linear": "L0 attention column"}``."""
        result: dict[str, str] = {}
        for a in self.assignments:
            result.setdefault(a.node, a.role)
        return result


def _check_devices(num_devices: int) -> None:
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices must be an int >= 1, got {num_devices!r}")


_GQA_CHOICES = ("replicate", "groups")


@takes_model()
def megatron_layout(
    model: onnx.ModelProto,
    num_devices: int,
    *,
    gqa: str = "replicate",
    batch: int | None = None,
    graph: PlanGraph | None = None,
    shapes: Mapping[str, tuple] | None = None,
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
        batch: The batch the model will run with, when known. A CNN (conv
            pairs, no linear pairs) then runs data parallel when the devices
            divide it: that moves no bytes in a forward pass, against one
            all-reduce per conv pair (`sharding.megatron.data`).
        graph: ``PlanGraph(model)`` when the caller has it already (the
            automatic search asks for several layouts of one model, with one
            shape inference).
        shapes: The model's inferred tensor shapes, when the caller has them
            (`sharding.shapes.infer_model`'s); else shape inference runs here
            (unused when ``graph`` is given).

    Returns:
        The `MegatronLayout`: pairs, embeddings, LM head, specs and notes.

    Raises:
        ValueError: ``num_devices`` < 1, or a node to annotate has no name.
    """
    _check_devices(num_devices)
    if gqa not in _GQA_CHOICES:
        raise ValueError(f"gqa must be one of {_GQA_CHOICES}, got {gqa!r}")
    n = num_devices
    graph = PlanGraph(model, shapes) if graph is None else graph
    notes: list[str] = []
    linears = find_linears(graph)
    paired, raw_pairs = pair_linears(graph, linears, notes)
    pairs, assignments = pair_assignments(graph, linears, raw_pairs, n, gqa, notes)
    embeddings, token_tables, embedding_specs = embedding_assignments(graph, n, notes)
    lm_head, head_specs = lm_head_assignments(graph, linears, paired, token_tables, n, notes)
    column_ways = {c: w for p in pairs for c, w in zip(p.columns, p.column_ways)}
    assignments += embedding_specs + head_specs + cache_assignments(graph, linears, column_ways, n)
    convs = conv_pairs(graph, n, notes) if not pairs else []
    if pairs and any(node.op_type == "Conv" for node in graph.nodes):
        notes.append("convolutions left whole: the linear pairs carry the split, and a channel-parallel "
                     "conv pair would add an all-reduce each to their minimum")
    for index, pair in enumerate(convs):
        assignments += conv_pair_assignments(graph, pair, n, index)
    rows = [p.row for p in pairs if p.ways > 1] + [p.row for p in convs]
    batch_specs = data_parallel(graph, rows, n, batch, notes) if rows else None
    if batch_specs is not None:  # fewer bytes: the layout is the batch split alone
        assignments, pairs, convs, embeddings, lm_head = batch_specs, [], [], [], None

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
        conv_pairs=tuple(convs),
    )


@takes_model()
def megatron_plan(
    model: onnx.ModelProto,
    num_devices: int,
    configuration: str = "tp",
    *,
    gqa: str = "replicate",
    node_devices: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
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
        batch: The batch the model will run with, when known; see
            `megatron_layout` (a CNN may then run data parallel).

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
    layout = megatron_layout(result, num_devices, gqa=gqa, batch=batch)
    if node_devices is None:
        write_megatron_plan(result, layout, configuration)
        return result
    wrong = sorted({len(g) for g in node_devices.values()} - {num_devices})
    if wrong:
        raise ValueError(f"node_devices: every group must have num_devices={num_devices} devices, got sizes {wrong}")
    add_configuration(result, configuration, max(d for g in node_devices.values() for d in g) + 1)
    missing = [a.node for a in layout.assignments if a.node not in node_devices]
    if missing:
        raise ValueError(f"node_devices has no group for node {missing[0]!r}")
    set_specs(
        result,
        (
            (a.node, remap_spec(a.spec, dict(enumerate(node_devices[a.node]))))
            for a in layout.assignments
        ),
        configuration,
    )
    return result


def write_megatron_plan(model: onnx.ModelProto, layout: MegatronLayout, configuration: str = "tp") -> None:
    """Writes ``layout``'s specs into ``model`` itself (no copy): the configuration, then every assignment.

    For a caller that owns the model (a generation handle that opened it, its weights still on disk), so
    that annotating it copies nothing; `megatron_plan` writes into a copy. Nodes must be named
    (`sharding.annotate.name_nodes`) before ``layout`` is found.

    Raises:
        ValueError: the configuration exists with another number of devices.
    """
    add_configuration(model, configuration, layout.num_devices)
    set_specs(model, ((a.node, a.spec) for a in layout.assignments), configuration)


__all__ = [
    "Assignment",
    "ConvPair",
    "Embedding",
    "Linear",
    "LinearPair",
    "MegatronLayout",
    "megatron_layout",
    "megatron_plan",
    "write_megatron_plan",
]
