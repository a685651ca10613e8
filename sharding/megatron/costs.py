"""What splitting a layer with no row partner would cost: where its split output is gathered.

A column split pays off only when a row-parallel layer reads the split (one
all-reduce for the pair). A column with no row partner (a patch or feature
projection, a classifier, a convolutional front end) hands its split output to
whatever reads it; the first reader that needs the split axis whole (a
normalisation or Softmax over it, an elementwise op meeting a whole tensor
such as a residual, a reshape that moves it) all-gathers the whole
activation. `gather_point` finds that reader, so the plan can leave such a
layer whole and say why; a split that reaches the graph outputs unchanged
(vocabulary-split logits) costs nothing inside the model.
"""

from __future__ import annotations

from sharding.op_facts import LAYER_NORMS, SKIP_LAYER_NORMS, SOFTMAXES
from sharding.megatron.graph import PlanGraph

# Ops that keep a split of the last axis when their other operands are constants.
_KEEPS = frozenset(
    """Relu LeakyRelu Elu Selu Celu Gelu Sigmoid HardSigmoid HardSwish Mish Softplus Softsign Tanh Erf
    Clip Identity Dropout Cast Neg Abs Exp Log Sqrt Reciprocal Pow Add Sub Mul Div""".split()
)
_NORMALISES = LAYER_NORMS | SKIP_LAYER_NORMS | SOFTMAXES | {"LpNormalization"}


def gather_point(graph: PlanGraph, tensor: str) -> tuple[str, str] | None:
    """The first reader that would gather ``tensor`` split on its last axis: (node, why).

    None when every path reaches a graph output with the split intact (no
    collective inside the model).
    """
    seen, todo = set(), [tensor]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for index in graph.consumers.get(name, []):
            node = graph.nodes[index]
            if node.op_type in _NORMALISES:
                return node.name, f"{node.op_type} over the split axis"
            if node.op_type.startswith("Reduce"):
                return node.name, f"{node.op_type} over the split axis"
            if node.op_type not in _KEEPS:
                return node.name, f"{node.op_type} needs the split axis whole"
            others = [i for i in node.input if i and i != name and i not in graph.constants]
            if others:
                return node.name, f"{node.op_type} meets {others[0]!r}, which is whole"
            todo += [o for o in node.output if o]
    return None


def left_whole_note(graph: PlanGraph, node: str, output: str) -> str:
    """The note for a linear with no row partner: why it stays whole."""
    found = gather_point(graph, output)
    if found is None:
        return (f"{node}: linear with no row partner and not a vocabulary head; its output reaches "
                "the graph outputs, which a split would leave split for the caller: left whole")
    where, why = found
    return (f"{node}: linear with no row partner; splitting it would all-gather its whole output "
            f"at {where} ({why}), more than the split saves: left whole")
