"""The text notation's printer: a spec as its shortest text (grammar in :mod:`sharding.text`).

It reads a spec's fields and imports no spec type at run time, so `sharding.spec` uses it
for ``ShardingSpec.__repr__`` and `sharding.text` (the parser, which builds specs) builds on both.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

REPLICATED = "replicated"


def _format_part(part: SimpleShardedDim) -> str:
    if part.dim_value is not None:
        size = str(part.dim_value)
    elif part.dim_param is not None:
        size = json.dumps(part.dim_param)
    else:
        size = "?"
    return f"{size}x{part.num_shards}"


def _format_dim(dim: ShardedDim) -> str:
    if len(dim.parts) == 1:
        part = dim.parts[0]
        if part.dim_value is None and part.dim_param is None:
            return f"{dim.axis}:{part.num_shards}"
    return f"{dim.axis}:({','.join(_format_part(p) for p in dim.parts)})"


def _format_set(members: tuple[int, ...]) -> str:
    return "{" + ",".join(map(str, members)) + "}"


def format_spec(spec: ShardingSpec) -> str:
    """Writes a spec in the text notation (the tensor name is not included).

    Args:
        spec: The spec.

    Returns:
        The shortest text that `parse_spec` reads back as ``spec``.

    Example:
        >>> from sharding.spec import ShardingSpec
        >>> format_spec(ShardingSpec.split("X", {0: 2}, [[0, 1], [2, 3]]))
        '0:2 @ [{0,1},{2,3}]'
    """
    dims = ",".join(_format_dim(d) for d in spec.sharded_dims) or REPLICATED
    group_map = dict(spec.groups)
    written: list[int] = []
    entries = []
    for entry in spec.devices:
        if entry >= 0 or entry in written:
            entries.append(str(entry))
            continue
        automatic = entry == -len(written) - 1
        entries.append(("" if automatic else str(entry)) + _format_set(group_map[entry]))
        written.append(entry)
    unused = [f"{key}{_format_set(m)}" for key, m in spec.groups if key not in written]
    body = ",".join(entries) + (";" + ",".join(unused) if unused else "")
    return f"{dims} @ [{body}]"
