"""The ``onnx2jax`` command line: one module per sub-command, the parser and dispatch in :mod:`onnx2jax.cli.app`."""

from onnx2jax.cli.app import main as main
