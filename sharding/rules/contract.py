"""The `contract` engine: a rule describes its op as an einsum over labels.

The op as an einsum over *labels*. Every input axis gets a
label (``None`` for a size-1 axis that is broadcast); output axes carry the
labels they come from (``None`` for a fresh, unsharded axis). A label that
two inputs shard must be sharded the same way; a sharded label that no output
keeps is reduced (partial results meet in a collective). Output shard ``o``
lives on the union, over the reduced blocks ``r``, of the intersection of the
devices that hold the input shards ``(o, r)`` needs (0007, "Composing
Sharding Specs on Different Axes"); an empty intersection is an error.
Two cuts of one label may also differ when one evenly refines the other
(GQA: 8 query-head blocks against 4 key-head blocks on device pairs); the
intersections decide. Where dropped labels are gathered rather than summed
(Concat, Softmax or a norm over a sharded axis), an input's pieces need only
meet somewhere: the block lives on the intersection, over inputs, of the
union of the devices holding each input's pieces.

Worked example of `contract` (0007's broadcast): ``Add(A[M,1], B[1,N])`` with
labels ``A: ("m", None)``, ``B: (None, "n")``, output ``("m", "n")``;
``A = 0:2 @ [{0,1},{2,3}]``, ``B = 1:2 @ [{0,2},{1,3}]``. Output block
``[i, j]`` needs A's shard i and B's shard j: ``[0,0] = {0,1} & {0,2} = {0}``,
``[0,1] = {1}``, ``[1,0] = {2}``, ``[1,1] = {3}``, so the output is
``0:2,1:2 @ [0,1,2,3]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sharding import codes
from sharding.rules.base import Dim, Label, NodeContext, Shape, Specs, devs, text
from sharding.rules.views import build_spec, clone_spec, device_sets, dim_key, node_devices, sharded_dims
from sharding.spec import ShardedDim, ShardingSpec


@dataclass
class Operand:
    """One input of a `contract`: its spec and a label per axis.

    Attributes:
        spec: The input's spec; None when unknown (then it is taken to be
            wherever it is needed: model inputs and constants are unsharded).
        labels: One per axis; None for a broadcast size-1 axis.
        shape: The input's shape, for sizes in keys and messages.
    """

    spec: ShardingSpec | None
    labels: Sequence[Label | None]
    shape: Shape | None = None


@dataclass
class _Cut:
    operand: int
    axis: int
    dim: ShardedDim
    key: tuple
    size: Dim = None


def _refinement(found: list[_Cut]) -> list[_Cut] | None:
    """The cuts, finest first, when they are plain splits that refine each other evenly.

    GQA: key/value heads cut in 4 on device pairs meet query heads cut in 8;
    block j of the 8 lies inside block j // 2 of the 4, so a device holding
    query block j holds the key block it needs.
    """
    if any(len(c.key) != 1 for c in found):
        return None
    finest = max(c.key[0] for c in found)
    size = next((c.size for c in found if isinstance(c.size, int)), None)
    if size is None or size % finest or any(finest % c.key[0] for c in found):
        return None
    return sorted(found, key=lambda c: -c.key[0])


def contract(
    ctx: NodeContext,
    operands: Sequence[Operand],
    outputs: Sequence[tuple[str, Sequence[Label | None]]],
    *,
    reduce_kind: str = "all-reduce",
    label_names: Mapping[Label, str] | None = None,
    mismatch_code: Mapping[Label, str] | None = None,
) -> Specs:
    """Output specs of an op described by axis labels (see the module docstring).

    Args:
        ctx: The node; diagnostics go to ``ctx``.
        operands: The inputs that take part (others are ignored).
        outputs: Per output, its tensor name and one label per axis.
        reduce_kind: The collective that combines results across a sharded
            label that an output drops (for notes).
        label_names: Readable names of labels for messages (``"K"``).
        mismatch_code: Diagnostic code per label for conflicting shardings
            (default ``sharding-mismatch``).

    Returns:
        One spec per output; None for every output when an input conflict
        makes the result meaningless.
    """
    names = label_names or {}
    cuts: dict[Label, list[_Cut]] = {}
    listing: list[list[Label]] = []
    bad = False
    for index, op in enumerate(operands):
        order: list[Label] = []
        listing.append(order)
        if op.spec is None:
            continue
        rank = len(op.labels)
        for axis, dim in sharded_dims(op.spec, rank):
            label = op.labels[axis]
            size = op.shape[axis] if op.shape is not None and axis < len(op.shape) else None
            if label is None:
                ctx.diag(
                    codes.BROADCAST_AXIS_SHARDED,
                    f"axis {axis} of {op.spec.tensor_name!r} has size 1 and is broadcast, "
                    f"but it is sharded in {dim.num_shards}",
                    f"replicate {op.spec.tensor_name!r} along axis {axis}",
                    tensor=op.spec.tensor_name,
                    axis=axis,
                    given=text(op.spec),
                    expected=f"axis {axis} unsharded",
                )
                bad = True
                continue
            cuts.setdefault(label, []).append(_Cut(index, axis, dim, dim_key(dim, size), size))
            order.append(label)
    for label, found in list(cuts.items()):
        if len({c.key for c in found}) > 1:
            refined = _refinement(found)
            if refined is not None:
                cuts[label] = refined
                continue
        first = found[0]
        for other in found[1:]:
            if other.key != first.key:
                a, b = operands[first.operand].spec, operands[other.operand].spec
                what = names.get(label, f"axis {other.axis}")
                code = (mismatch_code or {}).get(label, codes.SHARDING_MISMATCH)
                ctx.diag(
                    code,
                    f"{what}: {b.tensor_name!r} (axis {other.axis}) is cut as "
                    f"{_key_text(other.key)} but {a.tensor_name!r} (axis {first.axis}) as "
                    f"{_key_text(first.key)}; the same axis must be sharded the same way",
                    f"shard {b.tensor_name!r} on axis {other.axis} as {a.tensor_name!r} is "
                    f"on axis {first.axis}",
                    tensor=b.tensor_name,
                    axis=other.axis,
                    given=text(b),
                    expected=f"axis {other.axis} cut as {_key_text(first.key)}",
                )
                bad = True
    if bad:
        return [None] * len(outputs)

    fast = _follow_leader(operands, listing, cuts, outputs)
    if fast is not None:
        return fast
    # Global label order: the input with the most cuts leads, the others follow.
    order: list[Label] = []
    for index in sorted(range(len(operands)), key=lambda i: -len(listing[i])):
        order += [label for label in listing[index] if label not in order]
    count = {label: cuts[label][0].dim.num_shards for label in order}
    own = {(c.operand, label): c.dim.num_shards for label, found in cuts.items() for c in found}
    # Per operand: its labels with their mixed-radix weights (and the divisor
    # from the finest cut of the label to its own), and its shard device sets.
    weights: list[list[tuple[Label, int, int]]] = []
    sets: list[list[frozenset[int]] | None] = []
    for index, op in enumerate(operands):
        if op.spec is None:
            weights.append([])
            sets.append(None)
            continue
        stride = op.spec.num_shards
        w = []
        for label in listing[index]:
            stride //= own[index, label]
            w.append((label, stride, count[label] // own[index, label]))
        weights.append(w)
        sets.append(device_sets(op.spec))

    live = [i for i in range(len(operands)) if sets[i] is not None]
    results: Specs = []
    reported = False
    for name, labels in outputs:
        kept = [label for label in order if label in labels]
        dropped = [label for label in order if label not in labels]
        blocks: list[frozenset[int]] = []
        empty: list[tuple[tuple[int, ...], tuple[int, ...], list[str]]] = []
        gather = reduce_kind == "all-gather"
        for o in itertools.product(*(range(count[label]) for label in kept)):
            where = dict(zip(kept, o, strict=True))
            if gather:
                # Dropped labels are gathered: an input's pieces along them come
                # together on the devices holding any of them; the output block
                # lives where every input can be gathered.
                pieces: dict[int, frozenset[int]] = {}
                for r in itertools.product(*(range(count[label]) for label in dropped)):
                    where.update(zip(dropped, r, strict=True))
                    for index in live:
                        shard = sum(where[label] // div * stride for label, stride, div in weights[index])
                        pieces[index] = pieces.get(index, frozenset()) | sets[index][shard]
                inter = frozenset.intersection(*pieces.values()) if pieces else None
                if inter is not None and not inter:
                    needs = [f"{operands[i].spec.tensor_name!r} on {devs(pieces[i])}" for i in live]
                    empty.append((o, (), needs))
                blocks.append(inter or frozenset())
                continue
            union: set[int] = set()
            for r in itertools.product(*(range(count[label]) for label in dropped)):
                where.update(zip(dropped, r, strict=True))
                inter = None
                for index in live:
                    shard = sum(where[label] // div * stride for label, stride, div in weights[index])
                    held = sets[index][shard]
                    inter = held if inter is None else inter & held
                if inter is not None and not inter:
                    empty.append((o, r, _needs(operands, live, weights, sets, where)))
                elif inter is not None:
                    union |= inter
            blocks.append(frozenset(union))
        if empty:
            if not reported:
                shown = "; ".join(
                    f"output block {list(o)}"
                    + (f" (reduced block {list(r)})" if r else "")
                    + " needs "
                    + " and ".join(needs)
                    for o, r, needs in empty[:4]
                )
                more = f" (and {len(empty) - 4} more)" if len(empty) > 4 else ""
                given = "; ".join(
                    f"{operands[i].spec.tensor_name}: {text(operands[i].spec)}" for i in live
                )
                ctx.diag(
                    codes.EMPTY_INTERSECTION,
                    f"no device holds all the input shards some output block needs: {shown}{more}",
                    "place the inputs' shards so that each output block's inputs meet on "
                    "some device (0007: the devices of output shard [i,j] are the intersection "
                    "of those of the input shards it uses)",
                    tensor=name,
                    given=given,
                    expected="every output block's input shards on a common device",
                )
                reported = True
            results.append(None)
            continue
        dims = []
        for label in kept:
            cut = cuts[label][0]
            axis = list(labels).index(label)
            dims.append(ShardedDim(axis, cut.dim.parts))
        if not dims and not blocks[0]:
            results.append(None)
            continue
        results.append(build_spec(name, dims, blocks))
        if dropped:
            what = "; ".join(_label_text(label, cuts[label], operands, names) for label in dropped)
            ctx.diag(
                codes.COLLECTIVE,
                f"{what}, but {name!r} does not keep it: the partial results meet in an "
                f"{reduce_kind} over devices {devs(node_devices([results[-1]]))}",
                severity="note",
                tensor=name,
                expected=reduce_kind,
            )
    return results


def _follow_leader(operands, listing, cuts, outputs) -> Specs | None:
    """The common case without intersections to compute, or None.

    One input (the leader) is cut; every other input is either cut the same
    way on the same devices or whole on a superset of the leader's devices;
    every output keeps all the leader's cut labels. Then each output is the
    leader's spec with its dims moved to the output axes.
    """
    leader = max(range(len(operands)), key=lambda i: len(listing[i]))
    lead = operands[leader].spec
    if lead is None or not listing[leader] or len(listing[leader]) != len(cuts):
        return None
    held = None
    for index, op in enumerate(operands):
        if index == leader or op.spec is None:
            continue
        if listing[index]:
            if listing[index] != listing[leader] or op.spec.devices != lead.devices or op.spec.groups != lead.groups:
                return None
        else:
            if op.spec.num_shards != 1:
                return None
            if held is None:
                held = node_devices([lead])
            if not held <= device_sets(op.spec)[0]:
                return None
    results: Specs = []
    for name, labels in outputs:
        labels = list(labels)
        if any(label not in labels for label in listing[leader]):
            return None
        dims = tuple(ShardedDim(labels.index(label), cuts[label][0].dim.parts) for label in listing[leader])
        results.append(clone_spec(name, dims, lead.devices, lead.groups))
    return results


def _needs(operands, live, weights, sets, where) -> list[str]:
    needs = []
    for index in live:
        shard = sum(where[label] // div * stride for label, stride, div in weights[index])
        held = sets[index][shard]
        needs.append(f"shard {shard} of {operands[index].spec.tensor_name!r} on {devs(held)}")
    return needs


def _key_text(key: tuple) -> str:
    if len(key) == 1:
        return f"{key[0]} shards"
    return "fused " + " x ".join(f"({s} in {n})" for s, n in key)


def _label_text(label, found: Sequence[_Cut], operands: Sequence[Operand], names) -> str:
    """``K (axis 2 of 'x', axis 0 of 'w') is cut in 4``."""
    where = ", ".join(f"axis {c.axis} of {operands[c.operand].spec.tensor_name!r}" for c in found)
    head = f"{names[label]} ({where})" if label in names else where
    return f"{head} is cut in {found[0].dim.num_shards}"


def elementwise_labels(
    shape: Shape | None, out_rank: int, out_shape: Shape | None
) -> list[Label | None] | None:
    """Labels of an input broadcast (right-aligned) to an output of ``out_rank``.

    A size-1 axis facing a larger (or unknown) output size is broadcast
    (label None); every other axis shares the output axis's label (its index).
    """
    if shape is None:
        return None
    offset = out_rank - len(shape)
    labels: list[Label | None] = []
    for axis, size in enumerate(shape):
        out_axis = axis + offset
        out_size = out_shape[out_axis] if out_shape is not None else None
        if size == 1 and out_size != 1:
            labels.append(None)
        else:
            labels.append(out_axis)
    return labels
