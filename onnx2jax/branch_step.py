"""The host step of an If whose branches differ in shape: read the condition, run one branch jitted.

:mod:`sharding.segments` cuts such an If out of the jitted programs (its
outputs' shapes depend on the condition's value). This step reads the
condition on the host and runs the chosen branch as a model of its own, built
once per branch on first use: its graph inputs are the outer-scope names the
branch reads, so it is jitted and cached per shape signature like any other
segment, and a data-dependent node inside it is cut in turn.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx

from sharding.shapes import node_inputs


def branch_model(step: onnx.ModelProto, branch: onnx.GraphProto) -> onnx.ModelProto:
    """``branch`` of the If in ``step`` (a host step's model) as a standalone model.

    Its inputs are the step's inputs (typed as the step types them) that the
    branch reads from the outer scope; the step's initializers and the
    constants it recomputes (its other nodes) come along; its outputs are the
    branch's, in order.
    """
    probe = onnx.NodeProto(op_type="If")
    probe.attribute.add(name="then_branch", type=onnx.AttributeProto.GRAPH).g.CopyFrom(branch)
    others = [n for n in step.graph.node if n.op_type != "If"]
    read = set(node_inputs(probe)).union(*(node_inputs(n) for n in others))
    graph = onnx.GraphProto(name=branch.name or "branch")
    graph.node.extend(others)
    graph.node.extend(branch.node)
    graph.initializer.extend(branch.initializer)
    graph.initializer.extend(i for i in step.graph.initializer if i.name in read)
    graph.input.extend(i for i in step.graph.input if i.name in read)
    graph.output.extend(branch.output)
    graph.value_info.extend(branch.value_info)
    model = onnx.ModelProto()
    model.CopyFrom(step)
    model.graph.CopyFrom(graph)
    return model


def if_step(
    step: onnx.ModelProto, build: Callable[[onnx.ModelProto], Callable[[Mapping[str, Any]], Sequence[Any]]]
) -> Callable[[Mapping[str, Any]], list]:
    """The runner of a host step made of one If node.

    ``build`` turns a branch's model into a runner (named inputs -> outputs in
    order); it is called once per branch, on the branch's first use. The
    runner returns the step model's outputs, in its order.
    """
    (node,) = [n for n in step.graph.node if n.op_type == "If"]
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    runners: dict[bool, tuple[list[str], Callable]] = {}
    wanted = [o.name for o in step.graph.output]

    def run(values: Mapping[str, Any]) -> list:
        cond = bool(np.asarray(values[node.input[0]]).reshape(()))
        if cond not in runners:
            model = branch_model(step, branches["then_branch" if cond else "else_branch"])
            runners[cond] = ([i.name for i in model.graph.input], build(model))
        names, runner = runners[cond]
        outputs = dict(zip(node.output, runner({n: values[n] for n in names})))
        return [outputs[name] for name in wanted]

    return run
