"""The ``onnx2jax`` command line.

One module per sub-command (``onnx2jax/cli/<command>.py``: ``add_parser(subparsers)`` and
``run(args) -> int``), the parser and dispatch in :mod:`onnx2jax.cli.app`, shared pieces in
:mod:`~onnx2jax.cli.options`, :mod:`~onnx2jax.cli.inputs`, :mod:`~onnx2jax.cli.console` and
:mod:`~onnx2jax.cli.errors`. A new command is a new module plus one entry in ``app.COMMANDS``.
"""

from onnx2jax.cli.app import main as main
