"""Views of a spec the rules reason with: its sharded axes resolved against a rank, its parts
and device sets, and specs built back from them (renamed, replicated, from blocks)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

from sharding.rules.base import Dim
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim


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
    return clone_spec(name, spec.sharded_dims, spec.devices, spec.groups)


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


def clone_spec(name, dims, devices, groups) -> ShardingSpec:
    """A spec built from the parts of a valid one (same shard count), without re-validating."""
    clone = object.__new__(ShardingSpec)
    object.__setattr__(clone, "tensor_name", name)
    object.__setattr__(clone, "sharded_dims", dims)
    object.__setattr__(clone, "devices", devices)
    object.__setattr__(clone, "groups", groups)
    return clone
