"""What the Megatron plan reads off onnxruntime-genai builder graphs (and other com.microsoft graphs).

* **Quantized linears.** ``MatMulNBits(A, B, scales, zero_points, g_idx, bias)`` with ``B`` a packed
  initializer ``[N, n_blocks, blob]``: a linear whose N axis is B's axis 0 and whose K axis is B's *blocks*
  axis 1 (a row split cuts whole blocks, so its shard count must divide ``n_blocks``); ``scales`` and
  ``zero_points`` (``[N, n_blocks']`` or flat ``[N * n_blocks']``) are cut alike.
* **Attention ops.** ``GroupQueryAttention`` (and ``MultiHeadAttention``/``Attention``) are where a
  walk between a column and a row crosses attention. A linear whose output (after its bias) is the packed
  q|k|v ``query`` of a GroupQueryAttention with no separate key/value is its packed projection:
  `packed_attention` gives the node and its heads. With as many kv heads as query heads the parts are
  equal and the projection is split through a fused axis; otherwise no spec of the packed weight gives
  every device its query heads' kv heads (sharding.rules.contrib_attention), so it stays whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from sharding.megatron.graph import PlanGraph

ATTENTION_OPS = frozenset({"GroupQueryAttention", "MultiHeadAttention", "Attention", "PackedAttention"})


@dataclass(frozen=True)
class PackedAttention:
    """A GroupQueryAttention fed a packed q|k|v by one linear.

    Attributes:
        node: The GroupQueryAttention node's name.
        heads: Query heads (``num_heads``).
        kv_heads: Key/value heads (``kv_num_heads``).
        past: Its past_key and past_value inputs (names; empty where absent).
        present: Its present_key and present_value outputs.
        output: Its attention output.
        query: The packed q|k|v it reads.
    """

    node: str
    heads: int
    kv_heads: int
    past: tuple[str, str]
    present: tuple[str, str]
    output: str
    query: str


def quantized_weight(graph: PlanGraph, node: onnx.NodeProto) -> bool:
    """Whether ``node`` is a MatMulNBits whose packed weight is a 3-D initializer."""
    return (
        node.op_type == "MatMulNBits"
        and len(node.input) > 2
        and len(graph.inits.get(node.input[1], ())) == 3
        and graph.attr(node, "K") is not None
        and graph.attr(node, "N") is not None
    )


def _item(names, index: int) -> str:
    return names[index] if index < len(names) else ""


def packed_attention(graph: PlanGraph, output: str) -> PackedAttention | None:
    """The GroupQueryAttention reading ``output`` as its packed q|k|v, or None."""
    consumers = graph.consumers.get(output, [])
    if len(consumers) != 1:
        return None
    node = graph.nodes[consumers[0]]
    if node.op_type != "GroupQueryAttention" or node.input[0] != output or _item(node.input, 1):
        return None
    return PackedAttention(
        node=node.name,
        heads=int(graph.attr(node, "num_heads")),
        kv_heads=int(graph.attr(node, "kv_num_heads")),
        past=(_item(node.input, 3), _item(node.input, 4)),
        present=(_item(node.output, 1), _item(node.output, 2)),
        output=node.output[0],
        query=output,
    )
