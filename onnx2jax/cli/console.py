"""The console every ``onnx2jax`` command prints through.

On a terminal: rich, at the terminal's width; tables fold long cells rather
than running past the edge. Piped or redirected: plain text (rich drops
colours and spinners itself), lines not wrapped, and tables laid out at least
200 columns wide so that no cell is cut or folded for ``grep``.
"""

from __future__ import annotations

from rich.console import Console

PIPED_WIDTH = 200


def make_console(*, stderr: bool = False) -> Console:
    """A rich Console for command output (see the module docstring); ``stderr=True`` for spinners and progress.

    A spinner on stderr leaves stdout to the results, so ``onnx2jax check m.onnx > out.txt`` still shows it.
    """
    console = Console(highlight=False, stderr=stderr)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(console.width, PIPED_WIDTH), soft_wrap=True, stderr=stderr)
    return console
