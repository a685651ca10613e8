"""Reshards: when two specs of one tensor differ, which collective moves the data.

Proposal 0007 lets a node's written output spec differ from what its inputs
imply, and its written input specs differ from what their producers leave:
the data is resharded, at the cost of a collective. `reshard_kind` names it
(after XLA's collectives):

===================  =========================================================
kind                 when
===================  =========================================================
all-gather           axes sharded before are whole after
dynamic-slice        axes whole before are sharded after, or an axis's blocks are cut finer
                     on devices that hold them (local, no traffic)
all-to-all           the sharding moves from some axes to others
collective-permute   the same cuts on other devices
broadcast            the same cuts, copied to more devices
===================  =========================================================
"""

from __future__ import annotations

from collections.abc import Sequence

from sharding.rules.base import Shape
from sharding.rules.views import device_sets, dim_key, node_devices, sharded_dims
from sharding.spec import ShardingSpec


def _cuts(spec: ShardingSpec, shape: Shape | None) -> dict[int, tuple]:
    rank = None if shape is None else len(shape)
    return {
        axis: dim_key(dim, shape[axis] if shape is not None else None)
        for axis, dim in sharded_dims(spec, rank)
    }


def _layout(spec: ShardingSpec, shape: Shape | None) -> tuple:
    rank = None if shape is None else len(shape)
    cuts = tuple(
        (axis, dim_key(dim, shape[axis] if shape is not None else None))
        for axis, dim in sharded_dims(spec, rank)
    )
    return cuts, tuple(device_sets(spec))


def same_spec(a: ShardingSpec, b: ShardingSpec, shape: Shape | None) -> bool:
    """Whether two specs place a tensor alike (fast structural test, then canonical forms)."""
    if a.sharded_dims == b.sharded_dims and a.devices == b.devices and a.groups == b.groups:
        return True
    if _layout(a, shape) == _layout(b, shape):
        return True
    if shape is not None and all(isinstance(d, int) for d in shape):
        try:
            return a.canonical(shape) == b.canonical(shape)
        except ValueError:
            return False
    return False


def _refines_locally(src: ShardingSpec, dst: ShardingSpec, shape: Shape | None) -> bool:
    """One axis, plain cuts, ``dst``'s t blocks refining ``src``'s s blocks, each on devices that hold the
    block it lies in (GQA: 2 kv-head groups on 4 devices each, cut into 8 query-head blocks)."""
    rank = None if shape is None else len(shape)
    (a, da), (b, db) = (sharded_dims(src, rank) or [(None, None)])[0], (sharded_dims(dst, rank) or [(None, None)])[0]
    if len(sharded_dims(src, rank)) != 1 or len(sharded_dims(dst, rank)) != 1 or a != b:
        return False
    if len(da.parts) != 1 or len(db.parts) != 1 or db.num_shards % da.num_shards:
        return False
    ratio = db.num_shards // da.num_shards
    held = device_sets(src)
    return all(devices <= held[j // ratio] for j, devices in enumerate(device_sets(dst)))


def reshard_kind(src: ShardingSpec, dst: ShardingSpec, shape: Shape | None) -> str | None:
    """The collective that turns ``src`` into ``dst``; None when they are the same.

    Args:
        src: The spec the data has.
        dst: The spec it must have.
        shape: The tensor's shape, if known (for ranks and sizes).

    Example:
        >>> a = ShardingSpec.split("X", {1: 2}, [0, 1])
        >>> reshard_kind(a, ShardingSpec.replicated("X", [0, 1]), (4, 4))
        'all-gather'
    """
    if same_spec(src, dst, shape):
        return None
    before, after = _cuts(src, shape), _cuts(dst, shape)
    removed = [a for a in before if after.get(a) != before[a]]
    added = [a for a in after if before.get(a) != after[a]]
    if removed and added:
        return "dynamic-slice" if _refines_locally(src, dst, shape) else "all-to-all"
    if removed:
        return "all-gather"
    if added:
        return "dynamic-slice"
    if not node_devices([dst]) <= node_devices([src]):
        return "broadcast"
    return "collective-permute"


def describe_kinds(kinds: Sequence[str]) -> str:
    """``"all-gather + dynamic-slice"`` style text."""
    return " + ".join(dict.fromkeys(kinds))
