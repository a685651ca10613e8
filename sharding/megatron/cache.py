"""KV caches of exported decoders (torch ``past_key_values``) in the Megatron plan.

A torch export with a cache concatenates each layer's past with the new keys or values along the
sequence axis: ``present = Concat(past_key_values.N.key, k, axis=-2)``, the past a model input of shape
``[B, KV, P, D]`` and the present a model output. Inference already splits ``present`` like ``k`` (by kv
heads, following the k/v projection's column split); `cache_assignments` also writes the *past* input that
way, on the Concat, so that a caller feeding the presents back (a generation loop) keeps the cache on the
devices of its heads instead of placing a whole copy on every device.
"""

from __future__ import annotations

from collections.abc import Mapping

from sharding.megatron.graph import PlanGraph
from sharding.megatron.linears import Linear
from sharding.megatron.specs import Assignment, split_spec


def cache_assignments(
    graph: PlanGraph, linears: dict[int, Linear], column_ways: Mapping[str, int], n: int
) -> list[Assignment]:
    """Specs of ``Concat(past, new)`` nodes whose past is a 4-D model input and whose new part comes from
    exactly one split column linear (k or v): both inputs and the output cut on axis 1 like that column."""
    out: list[Assignment] = []
    for node in graph.nodes:
        if node.op_type != "Concat" or len(node.input) != 2 or graph.attr(node, "axis") not in (-2, 2):
            continue
        past, new = node.input
        if past not in graph.inputs or graph.rank(past) != 4 or node.output[0] not in graph.outputs:
            continue
        sources, _ = graph.walk_back(new, set(linears))
        if len(sources) != 1:
            continue
        ways = column_ways.get(linears[next(iter(sources))].node, 1)
        if ways > 1:
            role = "KV cache"
            out += [Assignment(node.name, split_spec(t, 1, ways, n), role) for t in (past, new, node.output[0])]
    return out

