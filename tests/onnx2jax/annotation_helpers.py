"""Annotation variants for tests: the same plan written more or less completely.

``weights_only(model)`` keeps what a user (or another tool) would write by
hand: the specs on weight nodes and on graph outputs. Everything in between is
left to inference; a compiled model must then have exactly the collectives of
the fully annotated one (issue 10, "annotation independence").
"""

from __future__ import annotations

import copy

import onnx

WEIGHT_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Gather"})
_THROUGH = frozenset({"Transpose", "Cast", "Reshape", "Identity"})


def weight_nodes(model: onnx.ModelProto) -> set[str]:
    """Names of the MatMul/Gemm/Conv nodes that read a weight, and embedding Gathers.

    A weight is an initializer, or one seen through a Transpose, Cast, Reshape
    or Identity of an initializer (a transposed Linear weight, a tied LM head).
    A Gather counts only when its data input (the table) is a weight.
    """
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    for node in graph.node:
        if node.op_type in _THROUGH and node.input and node.input[0] in weights:
            weights.update(node.output)
    found = set()
    for node in graph.node:
        if node.op_type not in WEIGHT_OPS:
            continue
        reads = node.input[:1] if node.op_type == "Gather" else node.input[1:2]
        if any(name in weights for name in reads):
            found.add(node.name)
    return found


def weights_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` keeping only the specs on weight nodes and on graph outputs.

    Every other node loses its specs (its node-level configuration entry is
    dropped when no spec is left and it names no pipeline stage); device
    configurations themselves are kept.
    """
    out = copy.deepcopy(model)
    keep_nodes = weight_nodes(out)
    outputs = {o.name for o in out.graph.output}
    for node in out.graph.node:
        if node.name in keep_nodes:
            continue
        kept = []
        for config in node.device_configurations:
            specs = [s for s in config.sharding_spec if s.tensor_name in outputs and s.tensor_name in node.output]
            del config.sharding_spec[:]
            config.sharding_spec.extend(specs)
            if specs or config.HasField("pipeline_stage"):
                kept.append(copy.deepcopy(config))
        del node.device_configurations[:]
        node.device_configurations.extend(kept)
    return out


def spec_count(model: onnx.ModelProto) -> int:
    """How many specs the model's nodes carry, over all configurations."""
    return sum(len(c.sharding_spec) for n in model.graph.node for c in n.device_configurations)
