"""The console every ``onnx2jax`` command prints through.

On a terminal: rich, at the terminal's width; tables fold long cells rather
than running past the edge. Piped or redirected: plain text (rich drops
colours and spinners itself), lines not wrapped, and tables laid out at least
200 columns wide so that no cell is cut or folded for ``grep``.
"""

from __future__ import annotations

from rich.console import Console

PIPED_WIDTH = 200


def make_console() -> Console:
    """A rich Console for command output (see the module docstring)."""
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, PIPED_WIDTH), soft_wrap=True)
    return console
