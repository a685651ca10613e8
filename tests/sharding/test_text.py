"""The text notation: canonical texts, whitespace, explicit keys, errors with positions."""

import pytest

from sharding import (
    ShardedDim,
    ShardingSpec,
    SimpleShardedDim,
    SpecSyntaxError,
    format_spec,
    parse_spec,
)


def plain(axis, num_shards):
    return ShardedDim(axis, (SimpleShardedDim(num_shards),))


# Canonical text -> the spec it means, written by hand.
CANONICAL = {
    "0:2 @ [0,1]": ShardingSpec("X", (plain(0, 2),), (0, 1)),
    "1:2 @ [0,1]": ShardingSpec("X", (plain(1, 2),), (0, 1)),
    "0:2,1:2 @ [0,1,2,3]": ShardingSpec("X", (plain(0, 2), plain(1, 2)), (0, 1, 2, 3)),
    "replicated @ [{0,1}]": ShardingSpec("X", (), (-1,), ((-1, (0, 1)),)),
    "replicated @ [3]": ShardingSpec("X", (), (3,)),
    "0:2 @ [{0,1},{2,3}]": ShardingSpec(
        "X", (plain(0, 2),), (-1, -2), ((-1, (0, 1)), (-2, (2, 3)))
    ),
    "1:(2x1,64x2) @ [0,1]": ShardingSpec(
        "X",
        (ShardedDim(1, (SimpleShardedDim(1, dim_value=2), SimpleShardedDim(2, dim_value=64))),),
        (0, 1),
    ),
    "-1:(8x2) @ [1,0]": ShardingSpec(
        "X", (ShardedDim(-1, (SimpleShardedDim(2, dim_value=8),)),), (1, 0)
    ),
    '0:("N"x2) @ [0,1]': ShardingSpec(
        "X", (ShardedDim(0, (SimpleShardedDim(2, dim_param="N"),)),), (0, 1)
    ),
    '0:("seq \\"len\\""x2,?x1) @ [0,1]': ShardingSpec(
        "X",
        (ShardedDim(0, (SimpleShardedDim(2, dim_param='seq "len"'), SimpleShardedDim(1))),),
        (0, 1),
    ),
    "0:2 @ [{0,1},-1]": ShardingSpec("X", (plain(0, 2),), (-1, -1), ((-1, (0, 1)),)),
    "0:2 @ [-2{0,1},-1{3}]": ShardingSpec(
        "X", (plain(0, 2),), (-2, -1), ((-1, (3,)), (-2, (0, 1)))
    ),
    "0:2 @ [{1,0},-7{2,3}]": ShardingSpec(
        "X", (plain(0, 2),), (-1, -7), ((-1, (1, 0)), (-7, (2, 3)))
    ),
    "0:2 @ [0,1;-3{4,5}]": ShardingSpec("X", (plain(0, 2),), (0, 1), ((-3, (4, 5)),)),
    "0:2,1:3 @ [5,4,3,2,1,0]": ShardingSpec("X", (plain(0, 2), plain(1, 3)), (5, 4, 3, 2, 1, 0)),
}


@pytest.mark.parametrize("text, spec", CANONICAL.items(), ids=CANONICAL.keys())
def test_canonical_text_round_trips(text, spec):
    assert parse_spec(text, "X") == spec
    assert format_spec(spec) == text


@pytest.mark.parametrize(
    "text, canonical",
    [
        ("  0 : 2 , 1:2@[ 0 , 1,2 ,3 ] ", "0:2,1:2 @ [0,1,2,3]"),
        ("replicated@[ { 0 , 1 } ]", "replicated @ [{0,1}]"),
        ("1 : ( 2 x 1 , 64 x 2 ) @ [0,1]", "1:(2x1,64x2) @ [0,1]"),
        ("0:(?x2) @ [0,1]", "0:2 @ [0,1]"),
        ("0:2 @ [-1{0,1},-1]", "0:2 @ [{0,1},-1]"),
        ("0:2 @ [-1,{0,1}]", "0:2 @ [{0,1},-1]"),
        ("0:2 @ [-1{2,3},-2{0,1}]", "0:2 @ [{2,3},{0,1}]"),
        ("+0:2 @ [0,+1]", "0:2 @ [0,1]"),
    ],
)
def test_other_spellings_parse_to_the_canonical_one(text, canonical):
    assert format_spec(parse_spec(text)) == canonical


def test_tensor_name_is_given_separately():
    assert parse_spec("0:2 @ [0,1]").tensor_name == ""
    assert parse_spec("0:2 @ [0,1]", "W").tensor_name == "W"


@pytest.mark.parametrize(
    "text, position, message",
    [
        ("0 2 @ [0,1]", 2, "expected ':', found '2'"),
        ("0:2 [0,1]", 4, "expected '@'"),
        ("0:2 @ 0,1", 6, "expected '\\['"),
        ("0:2 @ [0,1", 10, "expected '\\]', found 'end of text'"),
        ("x:2 @ [0]", 0, "expected an axis"),
        ("0:0 @ [0]", 2, "num_shards must be >= 1"),
        ("0:(2x0) @ [0]", 3, "num_shards must be >= 1"),
        ("0:(2 1) @ [0]", 5, "expected 'x'"),
        ('0:("N x2) @ [0]', 3, "bad string"),
        ("0:2,0:2 @ [0,1,2,3]", 4, "axis 0 is listed twice"),
        ("0:2 @ [0]", 6, "1 entries but the spec has 2 shards"),
        ("0:2 @ [0,-3]", 9, "group key -3 is not defined"),
        ("0:2 @ [{0,1},-1{2}]", 13, "group key -1 is defined twice"),
        ("0:2 @ [-2{0},{1}]", 13, "group key -2 is defined twice"),
        ("0:2 @ [3{0},1]", 7, "group key 3 must be negative"),
        ("replicated @ [{}]", 15, "expected a device"),
        ("0:2 @ [0,1] extra", 12, "unexpected text after the device list"),
        ("0:2 @ [0,1;{4}]", 11, "expected a group key"),
    ],
)
def test_errors_point_at_the_character(text, position, message):
    with pytest.raises(SpecSyntaxError, match=message) as info:
        parse_spec(text)
    assert info.value.position == position
    assert info.value.text == text
    assert str(info.value).endswith(f"\n  {text}\n  {' ' * position}^")


def test_syntax_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_spec("nonsense")
