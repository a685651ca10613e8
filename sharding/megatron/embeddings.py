"""Embeddings and the LM head in the Megatron plan.

Token embeddings (a Gather on a 2-D initializer whose ids depend on a model
input's values) are split by vocabulary, output replicated (one all-reduce),
over every device even when the count does not divide the vocabulary
(GPT-2's 50,257 on 8: the last shard is shorter, held padded);
only the largest such tables count, so position ids computed from the token
ids (RoBERTa) do not make their small table a split one. Position/type
tables (ids computed from shapes or constants) stay replicated. The LM head
(an unpaired linear producing the vocabulary) is column-parallel, logits
left vocab-sharded; a head tied to the embedding table gets the same
vocabulary split on that one parameter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sharding.megatron.costs import gather_point, left_whole_note
from sharding.megatron.graph import PlanGraph
from sharding.megatron.linears import Linear
from sharding.megatron.specs import Assignment, column_specs, replicated_spec, split_spec


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



def vocab_ways(vocab: int, n: int) -> int:
    """Vocabulary shards on ``n`` devices: all ``n``, evenly or not (sharding proposal 0006 allows an
    uneven split; the runtime holds the table padded), so that no device holds the whole table; 1
    (replicated) only for a vocabulary smaller than ``n``."""
    return n if vocab >= n else math.gcd(vocab, n)


def embedding_assignments(
    graph: PlanGraph, n: int, notes: list[str]
) -> tuple[list[Embedding], dict[str, int], list[Assignment]]:
    """Every embedding lookup, the token tables (table -> vocabulary shards), and their specs.

    Position ids may be computed from the token ids (RoBERTa: a CumSum over the
    non-padding tokens); only the largest input-dependent tables are token tables,
    a vocabulary split of a small table would cost an all-reduce to save little.
    """
    assignments: list[Assignment] = []
    embeddings: list[Embedding] = []
    token_tables: dict[str, int] = {}
    lookups = [
        node
        for node in graph.nodes
        if node.op_type == "Gather"
        and len(graph.inits.get(node.input[0], ())) == 2
        and graph.attr(node, "axis", 0) == 0
    ]
    for node in graph.nodes:
        if node.op_type == "GatherBlockQuantized":
            notes.append(
                f"{node.name}: a quantized embedding (GatherBlockQuantized); the plan has no vocabulary "
                "split for it yet, so its table stays whole (replicated)"
            )
    dependent = {node.name: graph.depends_on_input(node.input[1]) for node in lookups}
    largest = max((graph.inits[x.input[0]][0] for x in lookups if dependent[x.name]), default=0)
    for node in lookups:
        table = node.input[0]
        vocab = graph.inits[table][0]
        token = dependent[node.name] and vocab == largest
        ways = vocab_ways(vocab, n) if token else None
        if token and ways is not None and vocab % ways:
            rows = -(-vocab // ways)
            notes.append(
                f"{node.name}: vocabulary {vocab} split unevenly over {ways} devices ({rows} rows each, "
                f"the last {vocab - rows * (ways - 1)}; held padded to {rows * ways}, as Megatron-LM pads it)"
            )
        if token and ways == 1:
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
                Assignment(node.name, split_spec(table, 0, ways, n), role_name),
                Assignment(node.name, replicated_spec(node.input[1], n), role_name),
                Assignment(node.name, replicated_spec(node.output[0], n), role_name),
            ]
    return embeddings, token_tables, assignments


def lm_head_assignments(
    graph: PlanGraph,
    linears: dict[int, Linear],
    paired: dict[int, str],
    token_tables: dict[str, int],
    n: int,
    notes: list[str],
) -> tuple[str | None, list[Assignment]]:
    """The LM head (the first unpaired linear producing the vocabulary, or tied to a token
    table) and its column specs; every other unpaired linear is noted and left replicated."""
    assignments: list[Assignment] = []
    lm_head = None
    vocabs = {graph.inits[t][0]: w for t, w in token_tables.items()}
    for index, lin in linears.items():
        if index in paired:
            continue
        ways = token_tables.get(lin.parameter) or vocabs.get(lin.out_features)
        gathered = gather_point(graph, lin.output) if ways is not None else None
        if lm_head is None and ways is not None and gathered is not None:
            notes.append(f"{lin.node}: produces the vocabulary, but splitting it would all-gather "
                         f"the logits at {gathered[0]} ({gathered[1]}): left whole")
        elif lm_head is None and ways is not None:
            lm_head = lin.node
            tied = " (tied)" if lin.parameter in token_tables else ""
            if ways > 1:
                assignments += column_specs(lin, ways, n, "LM head column" + tied)
            elif n > 1:
                notes.append(f"{lin.node}: LM head; vocabulary smaller than {n} devices shares no divisor with it; replicated")
        else:
            notes.append(left_whole_note(graph, lin.node, lin.output))
    return lm_head, assignments
