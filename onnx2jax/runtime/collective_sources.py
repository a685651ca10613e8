"""Prediction = program: the compiled program's collectives, by ONNX node, against inference's.

`sharding.infer` predicts each collective at a node: a ``collective`` note (the
partial results of a reduction over a sharded axis meet: all-reduce; a
normalisation over a sharded axis: all-gather) or a ``reshard`` note (a written
spec that differs from what reaches it). The runtime runs every node under a
named scope (`onnx2jax.runtime.constraints.node_scope`), so each collective of
the compiled HLO names the node it came from in its ``op_name`` metadata.
`differences` sets one against the other and says, for each collective XLA
added, at which node and from which jax operation; for each predicted one the
program lacks, that XLA merged or dropped it (partial sums that are added
before they meet need one all-reduce, as GPT-NeoX's parallel residual; its
all-reduce combiner merges independent all-reduces into one tuple all-reduce).
"""

from __future__ import annotations

import collections
import re

from sharding import codes
from sharding.infer import reshard_note_kind
from sharding.inference import Inference

_KINDS = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
_LINE = re.compile(r"=\s*[^=\n]*?\b(" + "|".join(_KINDS) + r")(?:-start)?\((.*)$", re.M)
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_SCOPE = re.compile(r"onnx:([^/]*)")
# The jax operation named last in op_name, and what it means for a collective XLA placed there.
_WHY = {
    "sharding_constraint": "resharding the value to the spec the node asks",
    "dot_general": "the partitioner's choice for this product's operands",
    "conv_general_dilated": "the partitioner gathers this convolution's operands",
}


def compiled_collectives(hlo_text: str) -> list[tuple[str, str | None, str]]:
    """Every collective of compiled HLO text: (kind, ONNX node or None, jax op_name)."""
    found = []
    for match in _LINE.finditer(hlo_text):
        op_name = _OP_NAME.search(match.group(2))
        name = op_name.group(1) if op_name else ""
        found.append((match.group(1), onnx_node(name), name))
    return found


def onnx_node(op_name: str) -> str | None:
    """The ONNX node an HLO instruction's ``op_name`` metadata names, or None where it names none.

    The innermost node scope wins: a row-parallel sum reduced inside the Add that adds it is the Add's.
    """
    scopes = _SCOPE.findall(op_name)
    return scopes[-1].replace("|", "/") if scopes else None


def predicted_collectives(inference: Inference) -> list[tuple[str, str]]:
    """Every collective inference predicts: (kind, node); local slices move nothing and are left out."""
    out = []
    for d in inference.diagnostics:
        if d.code == codes.COLLECTIVE and d.expected in _KINDS:
            out.append((d.expected, d.node))
        elif d.code == codes.RESHARD:
            for kind in reshard_note_kind(d).split(" + "):
                if kind in _KINDS:
                    out.append((kind, d.node))
    return out


def differences(hlo_text: str, inference: Inference | None) -> list[str]:
    """Notes naming each collective the program and the prediction do not share, or one saying they agree."""
    if inference is None:
        return []
    compiled = compiled_collectives(hlo_text)
    predicted = collections.Counter(predicted_collectives(inference))
    notes = []
    unmatched = []
    for kind, node, op_name in compiled:
        if predicted[(kind, node)] > 0:
            predicted[(kind, node)] -= 1
        else:
            unmatched.append((kind, node, op_name))
    for kind, node, op_name in unmatched:
        if node is None:  # no scope in its metadata (an executable from the persistent cache keeps the
            # metadata of the program first compiled): it may be any predicted one of its kind
            match = next((key for key, left in predicted.items() if key[0] == kind and left > 0), None)
            if match is not None:
                predicted[match] -= 1
                continue
        last = op_name.rsplit("/", 1)[-1]
        where = f"node {node!r}" if node else "an op whose metadata names no ONNX node"
        why = _WHY.get(last, f"placed by XLA at {last or 'an unnamed op'}")
        notes.append(f"XLA added an {kind} at {where} that inference did not predict: {why} ({op_name})")
    for (kind, node), left in predicted.items():
        if left > 0:
            notes.append(f"inference predicted {left} {kind} at node {node!r} that the program does not "
                         "hold: XLA merged it with another (partial sums added before they meet, or its "
                         "all-reduce combiner) or found it unneeded")
    if not notes and compiled:
        notes.append(f"the program's {len(compiled)} collectives are those inference predicted, node by node")
    return notes
