"""A short text notation for sharding specs, parsed and printed both ways.

Examples (tensor name given separately):

    0:2 @ [0,1]                  axis 0 in 2 shards, on devices 0 and 1
    0:2,1:2 @ [0,1,2,3]          axes 0 and 1 in 2 shards each (0006's 2x2)
    replicated @ [{0,1}]         no sharded axis, one shard on devices 0 and 1
    0:2 @ [{0,1},{2,3}]          shard 0 on devices 0,1; shard 1 on 2,3
    1:(2x1,64x2) @ [0,1]         fused axis 1 = sub-axes [2, 64], the second in 2
    -1:(8x2) @ [1,0]             axis -1 of size 8 (dim_value written) in 2
    0:("N"x2) @ [0,1]            axis 0 of symbolic size N (dim_param) in 2
    0:2 @ [{0,1},-1]             one group (key -1) holding both shards
    0:2 @ [-2{0,1},-1{2,3}]      keys written out (they are not -1, -2 in order)
    0:2 @ [0,1;-3{4,5}]          a group that no shard uses (after ';')

Grammar (whitespace is allowed between tokens)::

    spec    := dims "@" "[" entry ("," entry)* [";" keyed ("," keyed)*] "]"
    dims    := "replicated" | dim ("," dim)*
    dim     := INT ":" (INT | "(" part ("," part)* ")")
    part    := (INT | STRING | "?") "x" INT      sub-axis size x num_shards
    entry   := INT | [INT] set                   device, group key, or group
    keyed   := INT set
    set     := "{" INT ("," INT)* "}"

Numbering: shards are numbered row-major over the dims in the order written
(fused sub-axes likewise), and the entries list one device or group per shard.
An entry ``>= 0`` is a device; ``{...}`` is a group with the next automatic key
(the n-th group written gets key -n); ``-k{...}`` gives its key explicitly;
a bare negative ``-k`` refers to a group written elsewhere. STRING is a JSON
string; ``?`` is an unwritten size. `format_spec` writes the shortest form, so
``format_spec(parse_spec(t)) == t`` for such text and
``parse_spec(format_spec(s), s.tensor_name) == s`` for every spec.

The printer lives in :mod:`sharding.notation`, below `sharding.spec` (whose specs print
themselves with it); this module adds the parser.
"""

from __future__ import annotations

import json
import re

from sharding.notation import REPLICATED
from sharding.notation import format_spec as format_spec  # the printing half of the notation
from sharding.spec import ShardedDim, ShardingSpec, SimpleShardedDim

_INT = re.compile(r"[+-]?\d+")


class SpecSyntaxError(ValueError):
    """A spec's text is malformed or inconsistent.

    Attributes:
        text: The text parsed.
        position: Index of the offending character in ``text``.
    """

    def __init__(self, message: str, text: str, position: int) -> None:
        self.text = text
        self.position = position
        super().__init__(f"{message} at position {position}\n  {text}\n  {' ' * position}^")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def error(self, message: str, position: int | None = None) -> SpecSyntaxError:
        return SpecSyntaxError(message, self.text, self.pos if position is None else position)

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, token: str) -> bool:
        self.skip()
        return self.text.startswith(token, self.pos)

    def accept(self, token: str) -> bool:
        if self.peek(token):
            self.pos += len(token)
            return True
        return False

    def expect(self, token: str) -> None:
        if not self.accept(token):
            found = self.text[self.pos : self.pos + 1] or "end of text"
            raise self.error(f"expected {token!r}, found {found!r}")

    def integer(self, what: str) -> int:
        self.skip()
        match = _INT.match(self.text, self.pos)
        if not match:
            raise self.error(f"expected {what} (an integer)")
        self.pos = match.end()
        return int(match.group())

    def string(self) -> str:
        try:
            value, end = json.JSONDecoder().raw_decode(self.text, self.pos)
        except json.JSONDecodeError as e:
            raise self.error(f"bad string: {e.msg}") from None
        self.pos = end
        return value


def _parse_part(p: _Parser) -> SimpleShardedDim:
    p.skip()
    start = p.pos
    dim_value = dim_param = None
    if p.accept("?"):
        pass
    elif p.peek('"'):
        dim_param = p.string()
    else:
        dim_value = p.integer("a sub-axis size, a string or '?'")
    p.expect("x")
    num_shards = p.integer("num_shards")
    try:
        return SimpleShardedDim(num_shards, dim_value=dim_value, dim_param=dim_param)
    except ValueError as e:
        raise p.error(str(e), start) from None


def _parse_dims(p: _Parser) -> tuple[ShardedDim, ...]:
    if p.accept(REPLICATED):
        return ()
    dims = []
    while True:
        p.skip()
        start = p.pos
        axis = p.integer("an axis")
        p.expect(":")
        if p.accept("("):
            parts = [_parse_part(p)]
            while p.accept(","):
                parts.append(_parse_part(p))
            p.expect(")")
        else:
            p.skip()
            shards_at = p.pos
            num_shards = p.integer("num_shards or '('")
            try:
                parts = [SimpleShardedDim(num_shards)]
            except ValueError as e:
                raise p.error(str(e), shards_at) from None
        if any(d.axis == axis for d in dims):
            raise p.error(f"axis {axis} is listed twice", start)
        dims.append(ShardedDim(axis, tuple(parts)))
        if not p.accept(","):
            return tuple(dims)


def _parse_set(p: _Parser) -> tuple[int, ...]:
    p.expect("{")
    members = [p.integer("a device")]
    while p.accept(","):
        members.append(p.integer("a device"))
    p.expect("}")
    return tuple(members)


def _parse_devices(p: _Parser) -> tuple[tuple[int, ...], tuple[tuple[int, tuple[int, ...]], ...]]:
    p.expect("[")
    entries: list[int] = []
    groups: dict[int, tuple[int, ...]] = {}
    used: list[tuple[int, int]] = []  # (key, position) of bare key references

    def define(key: int, members: tuple[int, ...], position: int) -> None:
        if key >= 0:
            raise p.error(f"group key {key} must be negative", position)
        if key in groups:
            raise p.error(f"group key {key} is defined twice; write keys explicitly", position)
        groups[key] = members

    while True:
        p.skip()
        start = p.pos
        if p.peek("{"):
            key = -len(groups) - 1
            define(key, _parse_set(p), start)
            entries.append(key)
        else:
            number = p.integer("a device, a group key or '{'")
            if p.peek("{"):
                define(number, _parse_set(p), start)
            elif number < 0:
                used.append((number, start))
            entries.append(number)
        if not p.accept(","):
            break
    if p.accept(";"):
        while True:
            p.skip()
            start = p.pos
            define(p.integer("a group key"), _parse_set(p), start)
            if not p.accept(","):
                break
    p.expect("]")
    for key, position in used:
        if key not in groups:
            raise p.error(f"group key {key} is not defined", position)
    return tuple(entries), tuple(groups.items())


def parse_spec(text: str, tensor_name: str = "") -> ShardingSpec:
    """Parses the text notation (see the module docstring).

    Args:
        text: E.g. ``"0:2 @ [{0,1},{2,3}]"``.
        tensor_name: The tensor the spec is about.

    Returns:
        The spec.

    Raises:
        SpecSyntaxError: The text is malformed or inconsistent; the message
            points at the character.

    Example:
        >>> parse_spec("0:2 @ [0,1]", "X").devices
        (0, 1)
    """
    p = _Parser(text)
    dims = _parse_dims(p)
    p.expect("@")
    p.skip()
    devices_at = p.pos
    devices, groups = _parse_devices(p)
    p.skip()
    if p.pos != len(text):
        raise p.error("unexpected text after the device list")
    try:
        return ShardingSpec(tensor_name, dims, devices, groups)
    except (TypeError, ValueError) as e:
        raise p.error(str(e), devices_at) from None
