"""Typed sharding values: ONNX's multi-device protos as frozen dataclasses.

Each value holds tuples only, validates cheap invariants when built, converts
losslessly from and to its proto (``from_proto`` / ``to_proto``), and is
compared by placement through `ShardingSpec.canonical` (DESIGN, point 5).

Example:
    >>> spec = ShardingSpec.split("W", {1: 2}, devices=[0, 1])
    >>> spec.devices_of_shard(1)
    (1,)
    >>> fused = ShardingSpec(
    ...     "W",
    ...     (ShardedDim(1, (SimpleShardedDim(4, dim_value=4), SimpleShardedDim(1, dim_value=2))),),
    ...     devices=(0, 1, 2, 3),
    ... )
    >>> same_placement(fused, ShardingSpec.split("W", {1: 4}, [0, 1, 2, 3]), (3, 8))
    True
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from sharding import _geometry
from sharding._fields import _as_int, _as_str, _as_tuple, _require, _set
from sharding.notation import format_spec


@dataclass(frozen=True, slots=True)
class SimpleShardedDim:
    """One (sub-)axis cut into ``num_shards`` blocks.

    Attributes:
        num_shards: Number of blocks, >= 1.
        dim_value: The (sub-)axis size, if written.
        dim_param: The (sub-)axis symbolic size, if written (exclusive with
            ``dim_value``).
    """

    num_shards: int
    dim_value: int | None = None
    dim_param: str | None = None

    def __post_init__(self) -> None:
        _set(self, "num_shards", _as_int(self.num_shards, "SimpleShardedDim.num_shards", 1))
        if self.dim_value is not None:
            _set(self, "dim_value", _as_int(self.dim_value, "SimpleShardedDim.dim_value", 0))
        if self.dim_param is not None:
            _as_str(self.dim_param, "SimpleShardedDim.dim_param")
            if self.dim_value is not None:
                raise ValueError(
                    "SimpleShardedDim.dim_value and dim_param are exclusive "
                    f"(got {self.dim_value} and {self.dim_param!r})"
                )

    @classmethod
    def from_proto(cls, proto: onnx.SimpleShardedDimProto) -> SimpleShardedDim:
        """Builds the value from a `SimpleShardedDimProto`.

        Raises:
            ValueError: ``num_shards`` is missing or < 1.
        """
        _require(proto, "num_shards")
        which = proto.WhichOneof("dim")
        return cls(
            proto.num_shards,
            dim_value=proto.dim_value if which == "dim_value" else None,
            dim_param=proto.dim_param if which == "dim_param" else None,
        )

    def to_proto(self) -> onnx.SimpleShardedDimProto:
        """Returns the equivalent `SimpleShardedDimProto`."""
        proto = onnx.SimpleShardedDimProto(num_shards=self.num_shards)
        if self.dim_value is not None:
            proto.dim_value = self.dim_value
        if self.dim_param is not None:
            proto.dim_param = self.dim_param
        return proto


@dataclass(frozen=True, slots=True)
class ShardedDim:
    """How one axis is sharded; several parts make a fused axis.

    Attributes:
        axis: The axis (negative counts from the end).
        parts: The sub-axes, outermost first; one part for a plain split.
    """

    axis: int
    parts: tuple[SimpleShardedDim, ...]

    def __post_init__(self) -> None:
        _set(self, "axis", _as_int(self.axis, "ShardedDim.axis"))
        parts = _as_tuple(self.parts, "ShardedDim.parts")
        if not parts:
            raise ValueError(f"ShardedDim.parts must not be empty (axis {self.axis})")
        for part in parts:
            if not isinstance(part, SimpleShardedDim):
                raise TypeError(
                    f"ShardedDim.parts must hold SimpleShardedDim, got {type(part).__name__}"
                )
        _set(self, "parts", parts)

    @property
    def num_shards(self) -> int:
        """Number of blocks along the axis: the product over its parts."""
        return math.prod(p.num_shards for p in self.parts)

    def part_sizes(self, size: int) -> tuple[int, ...]:
        """Sub-axis sizes for an axis of ``size``; one unwritten size is inferred.

        Args:
            size: The axis size.

        Returns:
            One size per part; their product is ``size``.

        Raises:
            ValueError: The written sizes disagree with ``size``, or more than
                one sub-axis of a fused axis has no ``dim_value``.
        """
        known = [p.dim_value for p in self.parts]
        if len(known) == 1:
            if known[0] is not None and known[0] != size:
                raise ValueError(f"axis {self.axis} has size {size} but dim_value is {known[0]}")
            return (size,)
        missing = [i for i, v in enumerate(known) if v is None]
        if len(missing) > 1:
            raise ValueError(
                f"fused axis {self.axis}: {len(missing)} sub-axes have no dim_value; "
                f"only one can be inferred from the axis size {size}"
            )
        rest = math.prod(v for v in known if v is not None)
        if not missing:
            if rest != size:
                raise ValueError(
                    f"fused axis {self.axis}: sub-axis sizes {tuple(known)} multiply to "
                    f"{rest}, but the axis has size {size}"
                )
            return tuple(known)  # type: ignore[arg-type]
        if (rest == 0 and size != 0) or (rest != 0 and size % rest):
            raise ValueError(
                f"fused axis {self.axis}: the written sub-axis sizes multiply to {rest}, "
                f"which does not divide the axis size {size}"
            )
        known[missing[0]] = size // rest if rest else 0
        return tuple(known)  # type: ignore[arg-type]

    @classmethod
    def from_proto(cls, proto: onnx.ShardedDimProto) -> ShardedDim:
        """Builds the value from a `ShardedDimProto`.

        Raises:
            ValueError: ``axis`` is missing, or there is no ``simple_sharding``.
        """
        _require(proto, "axis")
        return cls(proto.axis, tuple(SimpleShardedDim.from_proto(p) for p in proto.simple_sharding))

    def to_proto(self) -> onnx.ShardedDimProto:
        """Returns the equivalent `ShardedDimProto`."""
        return onnx.ShardedDimProto(
            axis=self.axis, simple_sharding=[p.to_proto() for p in self.parts]
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Canonical form of a spec on a concrete shape: which devices hold what.

    The tensor is cut, per axis, at the fewest points needed so that each cell
    of the resulting grid lies on one set of devices.

    Attributes:
        shape: The tensor shape.
        bounds: Per axis, the cut points ``(0, ..., size)``; ``(0,)`` for an
            empty axis.
        cells: Per grid cell, row-major, the sorted devices holding it.
    """

    shape: tuple[int, ...]
    bounds: tuple[tuple[int, ...], ...]
    cells: tuple[tuple[int, ...], ...]


@dataclass(frozen=True, slots=True, repr=False)
class ShardingSpec:
    """How one input or output of a node is laid out over devices.

    Attributes:
        tensor_name: The node input or output this spec is about.
        sharded_dims: The sharded axes; shards are numbered row-major over
            them in this order.
        devices: One entry per shard: a device index (>= 0) or a negative key
            of ``groups`` (the shard is replicated on that group).
        groups: ``index_to_device_group_map`` as ``(key, devices)`` pairs,
            sorted by key, -1 first. Any mapping or pair sequence is accepted.
    """

    tensor_name: str
    sharded_dims: tuple[ShardedDim, ...]
    devices: tuple[int, ...]
    groups: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def __post_init__(self) -> None:
        _as_str(self.tensor_name, "ShardingSpec.tensor_name")
        dims = _as_tuple(self.sharded_dims, "ShardingSpec.sharded_dims")
        for dim in dims:
            if not isinstance(dim, ShardedDim):
                raise TypeError(
                    f"ShardingSpec.sharded_dims must hold ShardedDim, got {type(dim).__name__}"
                )
        axes = [d.axis for d in dims]
        for axis in axes:
            if axes.count(axis) > 1:
                raise ValueError(f"ShardingSpec.sharded_dims: axis {axis} is listed twice")
        _set(self, "sharded_dims", dims)
        _set(self, "groups", self._normalise_groups(self.groups))
        devices = tuple(
            _as_int(d, "ShardingSpec.devices")
            for d in _as_tuple(self.devices, "ShardingSpec.devices")
        )
        _set(self, "devices", devices)
        keys = {key for key, _ in self.groups}
        for d in devices:
            if d < 0 and d not in keys:
                raise ValueError(f"ShardingSpec.devices: group key {d} is not in groups")
        if len(devices) != self.num_shards:
            raise ValueError(
                f"ShardingSpec.devices has {len(devices)} entries but the spec has "
                f"{self.num_shards} shards (one entry per shard)"
            )

    @staticmethod
    def _normalise_groups(groups: Any) -> tuple[tuple[int, tuple[int, ...]], ...]:
        pairs = (
            groups.items()
            if isinstance(groups, Mapping)
            else _as_tuple(groups, "ShardingSpec.groups")
        )
        result: dict[int, tuple[int, ...]] = {}
        for pair in pairs:
            key, members = _as_tuple(pair, "ShardingSpec.groups entry")
            key = _as_int(key, "ShardingSpec.groups key")
            if key >= 0:
                raise ValueError(f"ShardingSpec.groups: key {key} must be negative")
            if key in result:
                raise ValueError(f"ShardingSpec.groups: key {key} appears twice")
            members = tuple(
                _as_int(m, f"ShardingSpec.groups[{key}] device", 0)
                for m in _as_tuple(members, f"ShardingSpec.groups[{key}]")
            )
            if not members:
                raise ValueError(f"ShardingSpec.groups: group {key} is empty")
            result[key] = members
        return tuple(sorted(result.items(), reverse=True))

    def __repr__(self) -> str:
        return f"ShardingSpec({self.tensor_name!r}, {format_spec(self)!r})"

    @property
    def num_shards(self) -> int:
        """Number of shards: the product of every part's ``num_shards``."""
        return math.prod(d.num_shards for d in self.sharded_dims)

    def devices_of_shard(self, shard: int) -> tuple[int, ...]:
        """The devices holding shard number ``shard``.

        Raises:
            IndexError: ``shard`` is not in ``range(num_shards)``.
        """
        if not 0 <= shard < len(self.devices):
            raise IndexError(f"shard {shard} out of range for {len(self.devices)} shards")
        entry = self.devices[shard]
        return (entry,) if entry >= 0 else dict(self.groups)[entry]

    def all_devices(self) -> tuple[int, ...]:
        """Every device that holds a shard, sorted."""
        return tuple(sorted({d for k in range(self.num_shards) for d in self.devices_of_shard(k)}))

    @classmethod
    def replicated(cls, tensor_name: str, devices: Iterable[int]) -> ShardingSpec:
        """A whole tensor on every device of ``devices``.

        Args:
            tensor_name: The tensor.
            devices: One device, or several (then one group, key -1).

        Returns:
            A spec with no sharded dims.
        """
        members = tuple(devices)
        if len(members) == 1:
            return cls(tensor_name, (), members)
        return cls(tensor_name, (), (-1,), ((-1, members),))

    @classmethod
    def split(
        cls,
        tensor_name: str,
        shards: Mapping[int, int],
        devices: Sequence[int | Iterable[int]],
    ) -> ShardingSpec:
        """A plain split: each listed axis in ``num_shards`` blocks.

        Args:
            tensor_name: The tensor.
            shards: ``{axis: num_shards}``, outermost first.
            devices: One entry per shard: a device, or a collection of devices
                that replicate it (groups get keys -1, -2, ... in order).

        Returns:
            The spec.

        Example:
            >>> ShardingSpec.split("X", {0: 2}, [[0, 1], [2, 3]]).devices
            (-1, -2)
        """
        dims = tuple(ShardedDim(axis, (SimpleShardedDim(n),)) for axis, n in shards.items())
        entries: list[int] = []
        groups: list[tuple[int, tuple[int, ...]]] = []
        for entry in devices:
            if isinstance(entry, Iterable):
                key = -len(groups) - 1
                groups.append((key, tuple(entry)))
                entries.append(key)
            else:
                entries.append(entry)
        return cls(tensor_name, dims, tuple(entries), tuple(groups))

    def canonical(self, shape: Sequence[int]) -> Placement:
        """The canonical placement of a tensor of ``shape``.

        Two specs place the same elements on the same devices exactly when
        their canonical forms are equal: negative axes, 1-shard dims, fused
        axes that amount to plain splits and the numbering of shards and
        groups all disappear.

        Args:
            shape: The tensor's concrete shape.

        Returns:
            The `Placement`.

        Raises:
            ValueError: The spec does not fit ``shape``.
        """
        layouts = _geometry.axis_layouts(self, tuple(shape))
        set_ids: dict[frozenset[int], int] = {}
        shard_to_set = np.array(
            [
                set_ids.setdefault(frozenset(self.devices_of_shard(k)), len(set_ids))
                for k in range(self.num_shards)
            ],
            dtype=np.int64,
        )
        grid = shard_to_set[_geometry.run_grid(layouts)]
        bounds = []
        for axis, layout in enumerate(layouts):
            starts = [start for start, _, _ in layout.runs]
            if grid.shape[axis] > 1:
                others = tuple(a for a in range(grid.ndim) if a != axis)
                changed = np.any(np.diff(grid, axis=axis) != 0, axis=others)
                keep = np.concatenate(([0], np.flatnonzero(changed) + 1))
                grid = np.take(grid, keep, axis=axis)
                starts = [starts[j] for j in keep]
            bounds.append((*starts, layout.size))
        device_sets = [tuple(sorted(s)) for s in set_ids]
        cells = tuple(device_sets[i] for i in grid.ravel().tolist())
        return Placement(tuple(layout.size for layout in layouts), tuple(bounds), cells)

    @classmethod
    def from_proto(cls, proto: onnx.ShardingSpecProto) -> ShardingSpec:
        """Builds the value from a `ShardingSpecProto`.

        Raises:
            ValueError: A required field is missing or the proto is
                inconsistent (see the constructor).
        """
        _require(proto, "tensor_name")
        groups = []
        for entry in proto.index_to_device_group_map:
            _require(entry, "key")
            groups.append((entry.key, tuple(entry.value)))
        return cls(
            proto.tensor_name,
            tuple(ShardedDim.from_proto(d) for d in proto.sharded_dim),
            tuple(proto.device),
            tuple(groups),
        )

    def to_proto(self) -> onnx.ShardingSpecProto:
        """Returns the equivalent `ShardingSpecProto` (groups in key order, -1 first)."""
        return onnx.ShardingSpecProto(
            tensor_name=self.tensor_name,
            device=self.devices,
            index_to_device_group_map=[
                onnx.IntIntListEntryProto(key=key, value=members) for key, members in self.groups
            ],
            sharded_dim=[d.to_proto() for d in self.sharded_dims],
        )


def same_placement(a: ShardingSpec, b: ShardingSpec, shape: Sequence[int]) -> bool:
    """Whether two specs put the same elements of a ``shape`` tensor on the same devices.

    Raises:
        ValueError: One of the specs does not fit ``shape``.
    """
    return a.canonical(shape) == b.canonical(shape)


def remap_spec(spec: ShardingSpec, devices: Mapping[int, int]) -> ShardingSpec:
    """``spec`` with each device id ``d`` replaced by ``devices[d]`` (groups too).

    Raises:
        KeyError: the spec names a device the map lacks.
    """
    return dataclasses.replace(
        spec,
        devices=tuple(devices[d] if d >= 0 else d for d in spec.devices),
        groups=tuple((k, tuple(devices[d] for d in g)) for k, g in spec.groups),
    )
