"""Text pictures of tile placement, compared with hand-drawn boxes."""

import pytest

from sharding import parse_spec, render_tiles


def draw(*lines):
    return "\n".join(lines)


@pytest.mark.parametrize(
    "text, shape, picture",
    [
        (
            "0:2,1:2 @ [0,1,2,3]",
            (4, 4),
            draw("┌───┬───┐", "│ 0 │ 1 │", "├───┼───┤", "│ 2 │ 3 │", "└───┴───┘"),
        ),
        ("0:2 @ [0,1]", (4, 4), draw("┌───┐", "│ 0 │", "├───┤", "│ 1 │", "└───┘")),
        ("replicated @ [{0,1}]", (2, 2), draw("┌─────┐", "│ 0,1 │", "└─────┘")),
        (
            "0:2 @ [{0,1},{2,3}]",
            (2, 2),
            draw("┌─────┐", "│ 0,1 │", "├─────┤", "│ 2,3 │", "└─────┘"),
        ),
        (
            "1:(2x1,4x2) @ [0,1]",
            (3, 8),
            draw("┌───┬───┬───┬───┐", "│ 0 │ 1 │ 0 │ 1 │", "└───┴───┴───┴───┘"),
        ),
        ("0:3 @ [10,1,2]", (5,), draw("┌────┬───┬───┐", "│ 10 │ 1 │ 2 │", "└────┴───┴───┘")),
        ("replicated @ [7]", (), draw("┌───┐", "│ 7 │", "└───┘")),
    ],
)
def test_pictures(text, shape, picture):
    assert render_tiles(parse_spec(text), shape) == picture


def test_empty_tensor_and_high_rank():
    assert render_tiles(parse_spec("0:2 @ [0,1]"), (0, 3)) == "(no elements: shape (0, 3))"
    with pytest.raises(ValueError, match="rank <= 2"):
        render_tiles(parse_spec("0:2 @ [0,1]"), (2, 2, 2))
