"""What every rule shares: the node context, and two engines that build output specs.

A rule describes its op in one of two ways, and one engine does the rest:

- `contract`: the op as an einsum over *labels*. Every input axis gets a
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
- `regroup`: the op as a reshape of axis groups (Reshape, Squeeze, Flatten,
  Transpose...): each group of input axes becomes a group of output axes of the
  same element count, and a sharded axis that is split or fused becomes a
  fused-axis spec.

Worked example of `contract` (0007's broadcast): ``Add(A[M,1], B[1,N])`` with
labels ``A: ("m", None)``, ``B: (None, "n")``, output ``("m", "n")``;
``A = 0:2 @ [{0,1},{2,3}]``, ``B = 1:2 @ [{0,2},{1,3}]``. Output block
``[i, j]`` needs A's shard i and B's shard j: ``[0,0] = {0,1} & {0,2} = {0}``,
``[0,1] = {1}``, ``[1,0] = {2}``, ``[1,1] = {3}``, so the output is
``0:2,1:2 @ [0,1,2,3]``.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from sharding.diagnostics import Diagnostic, Severity
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim
from sharding.text import format_spec

Dim = int | str | None
Shape = tuple[Dim, ...]
Label = Hashable
Specs = list[ShardingSpec | None]
Result = tuple[Specs, list[Diagnostic]]


def text(spec: ShardingSpec | None) -> str:
    """A spec in the text notation, or ``"unknown"``."""
    return "unknown" if spec is None else format_spec(spec)


def devs(devices: Sequence[int] | frozenset[int]) -> str:
    """``{0,1}``-style text for a device set."""
    return "{" + ",".join(map(str, sorted(devices))) + "}"


@dataclass
class NodeContext:
    """What a rule may know about its node.

    Attributes:
        node: The node.
        in_shapes: Per input position, the shape (dims are ints, symbols or
            None), or None when unknown or the input is empty.
        out_shapes: Per output position, likewise.
        constants: Values of the inputs that are initializers or Constant
            outputs, by tensor name.
        opset: The model's default-domain opset.
        diagnostics: Where `diag` collects the rule's findings.
    """

    node: onnx.NodeProto
    in_shapes: tuple[Shape | None, ...]
    out_shapes: tuple[Shape | None, ...]
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)
    opset: int = 21
    diagnostics: list[Diagnostic] = field(default_factory=list)
    _attrs: dict[str, Any] | None = None

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def attrs(self) -> dict[str, Any]:
        """The node's attributes as Python values (graphs and tensors left as protos)."""
        if self._attrs is None:
            self._attrs = {a.name: helper.get_attribute_value(a) for a in self.node.attribute}
        return self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    def input_name(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def constant(self, index: int) -> np.ndarray | None:
        """The value of input ``index`` when it is a constant, else None."""
        name = self.input_name(index)
        return self.constants.get(name) if name else None

    def int_list(self, attr: str, index: int) -> list[int] | None:
        """An int list given as attribute ``attr`` (older opsets) or as constant input ``index``."""
        if attr in self.attrs:
            value = self.attrs[attr]
            return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        value = self.constant(index)
        return None if value is None else [int(v) for v in np.asarray(value).ravel()]

    def rank(self, index: int) -> int | None:
        shape = self.in_shapes[index] if index < len(self.in_shapes) else None
        return None if shape is None else len(shape)

    def out_rank(self, index: int) -> int | None:
        shape = self.out_shapes[index] if index < len(self.out_shapes) else None
        return None if shape is None else len(shape)

    def diag(
        self,
        code: str,
        message: str,
        hint: str | None = None,
        *,
        severity: Severity = "error",
        tensor: str | None = None,
        axis: int | None = None,
        given: str | None = None,
        expected: str | None = None,
    ) -> None:
        """Records a diagnostic about this node."""
        extra = {}
        if given is not None or expected is not None:
            extra = {"given": given, "expected": expected}
        self.diagnostics.append(
            Diagnostic(
                code=code,
                severity=severity,
                node=self.node.name,
                op_type=self.node.op_type,
                tensor=tensor,
                axis=axis,
                message=message,
                hint=hint,
                **extra,
            )
        )

    def unknown_rank(self, index: int = 0) -> None:
        """A warning that the rank of input ``index`` is unknown where a rule needs it."""
        name = self.input_name(index)
        self.unknown(f"the rank of {name!r} is unknown", tensor=name)

    def data_rank(self) -> int | None:
        """The rank of input 0, else of output 0 (ops that keep their rank); when neither is
        known, says so (`unknown_rank`) and returns None."""
        rank = self.rank(0) if self.rank(0) is not None else self.out_rank(0)
        if rank is None:
            self.unknown_rank(0)
        return rank

    def unknown(self, what: str, tensor: str | None = None) -> None:
        """A warning that a rule lacks a shape or constant it needs."""
        self.diag(
            "shape-unknown",
            f"cannot infer the output sharding: {what}",
            "give concrete input shapes (input_shapes= or --input-shape) or make the value "
            "a constant",
            severity="warning",
            tensor=tensor,
        )


# ---------------------------------------------------------------- spec views


def sharded_dims(spec: ShardingSpec, rank: int | None) -> list[tuple[int, ShardedDim]]:
    """The dims of ``spec`` that cut their axis (num_shards > 1), in listing order.

    Axes are normalised with ``rank`` when known; dims whose axis is out of
    range are left out (structural validation reports them).
    """
    return list(_sharded_dims(spec.sharded_dims, rank))


@functools.lru_cache(maxsize=4096)
def _sharded_dims(dims: tuple[ShardedDim, ...], rank: int | None) -> tuple[tuple[int, ShardedDim], ...]:
    result = []
    for dim in dims:
        if dim.num_shards == 1:
            continue
        axis = dim.axis
        if rank is not None:
            if not -rank <= axis < rank:
                continue
            axis %= rank
        elif axis < 0:
            continue
        result.append((axis, dim))
    return tuple(result)


def resolved_parts(dim: ShardedDim, size: Dim) -> list[tuple[int | None, int]]:
    """``(sub-axis size, num_shards)`` per part; sizes None where unknown."""
    if isinstance(size, int):
        try:
            return list(zip(dim.part_sizes(size), (p.num_shards for p in dim.parts), strict=True))
        except ValueError:
            pass
    return [(p.dim_value, p.num_shards) for p in dim.parts]


def simplify_parts(parts: Sequence[tuple[int | None, int]]) -> list[tuple[int | None, int]]:
    """Merges a 1-shard part into the part before it where that changes no placement.

    ``[(4, 4), (2, 1)]`` (axis of 8) is a plain 4-way split: the inner part
    only makes each block 2 long. Size-1 parts disappear.
    """
    out: list[tuple[int | None, int]] = []
    for size, shards in parts:
        if size == 1 and shards == 1:
            continue
        if shards == 1 and out:
            prev_size, prev_shards = out[-1]
            if prev_size is not None and size is not None and prev_size % prev_shards == 0:
                out[-1] = (prev_size * size, prev_shards)
                continue
        out.append((size, shards))
    return out


def make_dim(axis: int, parts: Sequence[tuple[int | None, int]]) -> ShardedDim | None:
    """A ShardedDim from parts, simplified; None when it cuts nothing."""
    parts = simplify_parts(parts)
    if math.prod(n for _, n in parts) == 1:
        return None
    if len(parts) == 1:
        return ShardedDim(axis, (SimpleShardedDim(parts[0][1]),))
    return ShardedDim(axis, tuple(SimpleShardedDim(n, dim_value=s) for s, n in parts))


@functools.lru_cache(maxsize=4096)
def dim_key(dim: ShardedDim, size: Dim) -> tuple:
    """What two shardings of one axis must agree on to be the same."""
    parts = simplify_parts(resolved_parts(dim, size))
    if len(parts) == 1:
        return (parts[0][1],)
    return tuple(parts)


def device_sets(spec: ShardingSpec) -> list[frozenset[int]]:
    """The devices of each shard."""
    return list(_device_sets(spec.devices, spec.groups))


@functools.lru_cache(maxsize=4096)
def _device_sets(devices, groups) -> tuple[frozenset[int], ...]:
    table = dict(groups)
    return tuple(frozenset((d,)) if d >= 0 else frozenset(table[d]) for d in devices)


def build_spec(
    name: str, dims: Sequence[ShardedDim], blocks: Sequence[frozenset[int]]
) -> ShardingSpec:
    """A spec from its dims and one device set per shard (groups keyed -1, -2, ...)."""
    return renamed(_build_spec(tuple(dims), tuple(blocks)), name)


@functools.lru_cache(maxsize=4096)
def _build_spec(dims: tuple[ShardedDim, ...], blocks: tuple[frozenset[int], ...]) -> ShardingSpec:
    entries: list[int] = []
    keys: dict[frozenset[int], int] = {}
    for members in blocks:
        if len(members) == 1:
            entries.append(next(iter(members)))
        else:
            key = keys.setdefault(members, -len(keys) - 1)
            entries.append(key)
    groups = tuple((key, tuple(sorted(m))) for m, key in keys.items())
    return ShardingSpec("", dims, tuple(entries), groups)


def renamed(spec: ShardingSpec, name: str) -> ShardingSpec:
    """The same spec about another tensor.

    Built without re-validating: only the name changes, and the spec was
    valid (inference renames thousands of specs; this keeps it fast).
    """
    if spec.tensor_name == name:
        return spec
    return _clone(name, spec.sharded_dims, spec.devices, spec.groups)


def replicated(name: str, devices: frozenset[int] | Sequence[int]) -> ShardingSpec:
    """The whole tensor on every one of ``devices``."""
    return build_spec(name, (), (frozenset(devices),))


def node_devices(specs: Iterable[ShardingSpec | None]) -> frozenset[int]:
    """Every device holding a shard of one of the specs."""
    found: frozenset[int] = frozenset()
    for spec in specs:
        if spec is not None:
            found = found | _all_devices(spec.devices, spec.groups)
    return found


@functools.lru_cache(maxsize=4096)
def _all_devices(devices, groups) -> frozenset[int]:
    return frozenset().union(*_device_sets(devices, groups))


# ---------------------------------------------------------------- contract


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
                    "broadcast-axis-sharded",
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
                code = (mismatch_code or {}).get(label, "sharding-mismatch")
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
                    "empty-intersection",
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
                "collective",
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
        results.append(_clone(name, dims, lead.devices, lead.groups))
    return results


def _clone(name, dims, devices, groups) -> ShardingSpec:
    """A spec built from the parts of a valid one (same shard count), without re-validating."""
    clone = object.__new__(ShardingSpec)
    object.__setattr__(clone, "tensor_name", name)
    object.__setattr__(clone, "sharded_dims", dims)
    object.__setattr__(clone, "devices", devices)
    object.__setattr__(clone, "groups", groups)
    return clone


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


# ---------------------------------------------------------------- regroup


def unshard(spec: ShardingSpec, axes: Sequence[int], rank: int | None, name: str) -> ShardingSpec:
    """``spec`` with ``axes`` gathered: each remaining shard on the union of the devices it spans."""
    keep = []
    for dim in spec.sharded_dims:
        axis = dim.axis % rank if rank else dim.axis
        keep.append(axis not in axes and dim.num_shards > 1)
    sets = device_sets(spec)
    counts = [d.num_shards for d in spec.sharded_dims]
    grid = np.arange(spec.num_shards).reshape(counts or [1])
    drop = tuple(i for i, k in enumerate(keep) if not k)
    kept_dims = [d for d, k in zip(spec.sharded_dims, keep, strict=True) if k]
    moved = (
        np.moveaxis(grid, drop, tuple(range(grid.ndim - len(drop), grid.ndim))) if drop else grid
    )
    flat = moved.reshape(-1, math.prod(counts[i] for i in drop) if drop else 1)
    blocks = [frozenset().union(*(sets[s] for s in row)) for row in flat.tolist()]
    return build_spec(name, kept_dims, blocks)


def reorder(devices: Sequence[int], counts: Sequence[int], perm: Sequence[int]) -> tuple[int, ...]:
    """Device entries renumbered when the shard axes (mixed radix ``counts``) are permuted."""
    if list(perm) == sorted(perm):
        return tuple(devices)
    grid = np.asarray(devices, dtype=np.int64).reshape(list(counts) or [1])
    return tuple(int(d) for d in np.transpose(grid, perm).ravel())


def regroup(
    ctx: NodeContext,
    spec: ShardingSpec,
    in_shape: Shape | None,
    out_shape: Shape | None,
    groups: Sequence[tuple[Sequence[int], Sequence[int]]],
    name: str,
) -> ShardingSpec | None:
    """The spec of a reshape whose axis groups are ``groups`` (input axes, output axes).

    A sharded axis in a 1:1 group moves to its output axis. In a larger group
    the axes are viewed as one row-major run of sub-axes (a sharded axis
    contributes its parts), cut again at the output axes' sizes; output axes
    that receive several sub-axes get fused-axis specs, simplified when they
    are plain splits (GQA's ``[4 in 4, 2 in 1]`` over 8 is 4 shards). Shard
    numbering follows the input's listing order, so devices are permuted
    where the output lists its dims in another order.

    Worked example: ``[B, S, 64] -> [B, S, 8, 8]`` with axis 2 in 8 shards:
    the group ``([2], [2, 3])`` cuts the sub-axis (64, 8 shards) at 8 into
    (8, 8 shards) x (8, 1 shard): the heads axis 2 is cut in 8.
    """
    rank = len(in_shape) if in_shape is not None else None
    cut = dict(sharded_dims(spec, rank))
    if not cut:
        return unshard(spec, [], rank, name)
    group_of = {axis: g for g, (ins, _) in enumerate(groups) for axis in ins}
    # Each sharded part of the input is an atom (axis, part); splitting gives pieces.
    atoms = [
        (axis, j) for axis, dim in cut.items() for j, p in enumerate(dim.parts) if p.num_shards > 1
    ]
    out_parts: dict[int, list[tuple[int | None, int, tuple | None]]] = {}
    gathered = []
    for axis, dim in cut.items():
        ins, outs = groups[group_of[axis]] if axis in group_of else ((), ())
        if not outs:
            gathered.append(axis)
        elif len(ins) == 1 and len(outs) == 1:
            size = in_shape[axis] if in_shape is not None else None
            out_parts[outs[0]] = [
                (s, n, (axis, j, 0) if n > 1 else None)
                for j, (s, n) in enumerate(resolved_parts(dim, size))
            ]
        elif outs[0] not in out_parts:
            sizes_in = [in_shape[a] if in_shape is not None else None for a in ins]
            sizes_out = [out_shape[a] if out_shape is not None else None for a in outs]
            symbolic = any(not isinstance(s, int) for s in sizes_in + sizes_out)
            split = _symbolic_group(ins, outs, sizes_in, sizes_out, cut) if symbolic else None
            if split is not None:
                out_parts.update(split)
                continue
            if symbolic:
                ctx.unknown(
                    f"axis {axis} of {spec.tensor_name!r} is sharded and reshaped together with "
                    f"axes of unknown size ({sizes_in} -> {sizes_out})",
                    tensor=spec.tensor_name,
                )
                return None
            split = _split_group(ins, outs, sizes_in, sizes_out, cut)
            if split is None:
                ctx.diag(
                    "reshape-unsupported",
                    f"axis {axis} of {spec.tensor_name!r} (parts {resolved_parts(dim, sizes_in[ins.index(axis)])} "
                    f"as (size, shards)) cannot follow the reshape {sizes_in} -> {sizes_out}: "
                    "a shard boundary falls inside an output axis's block; it is gathered",
                    "shard an axis that the reshape keeps whole, or reshard before it",
                    severity="warning",
                    tensor=spec.tensor_name,
                    axis=axis,
                    expected="all-gather",
                )
                gathered += [a for a in ins if a in cut]
            else:
                out_parts.update(split)
    if gathered:
        return regroup(
            ctx, unshard(spec, gathered, rank, spec.tensor_name), in_shape, out_shape, groups, name
        )
    count = {piece: n for parts in out_parts.values() for _, n, piece in parts if piece is not None}
    in_order = sorted(count, key=lambda piece: (atoms.index(piece[:2]), piece[2]))

    def first(axis: int) -> int:
        found = [in_order.index(p) for _, _, p in out_parts[axis] if p is not None]
        return min(found, default=len(in_order))

    dims, out_order = [], []
    for axis in sorted(out_parts, key=first):
        dim = make_dim(axis, [(s, n) for s, n, _ in out_parts[axis]])
        if dim is not None:
            dims.append(dim)
            out_order += [p for _, _, p in out_parts[axis] if p is not None]
    counts = [count[p] for p in in_order]
    devices = reorder(spec.devices, counts, [in_order.index(p) for p in out_order])
    return ShardingSpec(name, tuple(dims), devices, spec.groups)


def _symbolic_group(ins, outs, sizes_in, sizes_out, cut):
    """A group with symbolic sizes whose sharded sub-axes are static: pure fusion or pure unfusion.

    ``[B, H] -> [B*H]`` with H sharded fuses into parts ``(?, 1), (H, n)``;
    ``[B*H] -> [B, H]`` undoes it, each part landing on one output axis. At
    most one part may be of unknown size (a fused axis infers one from its
    size). None when the group is anything else.
    """
    atoms = []  # (size or None, shards, piece)
    for axis, size in zip(ins, sizes_in, strict=True):
        if axis in cut:
            for j, (s, n) in enumerate(resolved_parts(cut[axis], size)):
                if n > 1 and not isinstance(s, int):
                    return None
                atoms.append((s, n, (axis, j, 0) if n > 1 else None))
        elif size != 1:
            atoms.append((size if isinstance(size, int) else None, 1, None))
    if len(outs) == 1:
        merged: list = []
        for size, n, piece in atoms:
            if merged and n == 1 and merged[-1][1] == 1:
                prev = merged[-1][0]
                merged[-1] = (prev * size if prev is not None and size is not None else None, 1, None)
            else:
                merged.append((size, n, piece))
        if sum(size is None for size, _, _ in merged) > 1:
            return None
        return {outs[0]: merged}
    if len(ins) != 1:
        return None
    wanted = [(a, s) for a, s in zip(outs, sizes_out, strict=True) if s != 1]
    if len(wanted) != len(atoms):
        return None
    result = {a: [] for a in outs}
    for (axis, want), (size, n, piece) in zip(wanted, atoms, strict=True):
        if isinstance(want, int) and size is not None and size != want:
            return None
        if n > 1 and not isinstance(want, int):
            return None
        result[axis] = [(want if isinstance(want, int) else None, n, piece)]
    return result


def _split_group(ins, outs, sizes_in, sizes_out, cut):
    """Cuts one group's sub-axes at the output sizes; None when a block would straddle."""
    if 0 in sizes_in or 0 in sizes_out:
        return None
    atoms: list[list] = []  # [size, shards, atom id, piece]
    for axis, size in zip(ins, sizes_in, strict=True):
        if axis in cut:
            for j, (s, n) in enumerate(resolved_parts(cut[axis], size)):
                if s is None or s % n:
                    return None
                atoms.append([s, n, (axis, j) if n > 1 else None, 0])
        elif size != 1:
            atoms.append([size, 1, None, 0])
    # An unsharded run only lengthens the blocks before it: (2 in 2) (3) (4)
    # is (24 in 2), which [4, 2, 3] can cut at 4 even though 3 does not split.
    merged: list[list] = []
    for atom in atoms:
        if merged and atom[1] == 1 and merged[-1][0] % merged[-1][1] == 0:
            merged[-1][0] *= atom[0]
        else:
            merged.append(atom)
    atoms = merged
    result: dict[int, list] = {}
    k = 0
    for out_axis, want in zip(outs, sizes_out, strict=True):
        parts = []
        have = 1
        while have < want:
            if k >= len(atoms):
                return None
            s, n, a, piece = atoms[k]
            if have * s <= want:
                if want % (have * s):
                    return None
                parts.append((s, n, None if a is None else (*a, piece)))
                have *= s
                k += 1
                continue
            # Split this atom: the outer piece fills the axis, the inner stays.
            outer = want // have
            if s % outer:
                return None
            inner = s // outer
            block = s // n
            if block % inner == 0:  # blocks hold whole inner runs
                n_outer, n_inner = n, 1
            elif inner % block == 0:  # the inner run holds whole blocks
                n_inner = inner // block
                n_outer = n // n_inner
                if n_outer * n_inner != n or outer % n_outer:
                    return None
            else:
                return None
            parts.append((outer, n_outer, None if a is None or n_outer == 1 else (*a, piece)))
            atoms[k] = [inner, n_inner, a if n_inner > 1 else None, piece + 1]
            have *= outer
        result[out_axis] = parts
    return result


def reshape_groups(in_shape: Shape, out_shape: Shape) -> list[tuple[list[int], list[int]]]:
    """Axis groups of a row-major reshape ``in_shape -> out_shape``.

    Groups are found from both ends: an identical dim (same int or same
    symbol) maps 1:1, and runs of int dims with equal products form a group
    (``[B, S, 8, 8] -> [B*S, 64]`` ends with ``([2, 3], [1])``). What is left
    in the middle, where symbols differ, is one group.
    """
    front, i, j = _groups_from(list(in_shape), list(out_shape))
    rest_in, rest_out = list(in_shape[i:]), list(out_shape[j:])
    back, bi, bj = _groups_from(rest_in[::-1], rest_out[::-1])
    n_in, n_out = len(in_shape), len(out_shape)
    back = [
        (sorted(n_in - 1 - a for a in gi), sorted(n_out - 1 - b for b in go)) for gi, go in back
    ][::-1]
    middle_in = list(range(i, n_in - bi))
    middle_out = list(range(j, n_out - bj))
    middle = [(middle_in, middle_out)] if middle_in or middle_out else []
    return front + middle + back


def _groups_from(a: list, b: list) -> tuple[list[tuple[list[int], list[int]]], int, int]:
    """Groups from the front of ``a`` and ``b`` until a symbol stops them."""
    groups = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] is not None and a[i] == b[j]:
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
            continue
        gi, go, pi, po = [], [], 1, 1
        while not (gi and go and pi == po):
            if pi <= po and i + len(gi) < len(a) and isinstance(a[i + len(gi)], int):
                pi *= a[i + len(gi)]
                gi.append(i + len(gi))
            elif j + len(go) < len(b) and isinstance(b[j + len(go)], int) and (po < pi or not go):
                po *= b[j + len(go)]
                go.append(j + len(go))
            else:
                return groups, i, j
        groups.append((gi, go))
        i, j = i + len(gi), j + len(go)
    return groups, i, j
