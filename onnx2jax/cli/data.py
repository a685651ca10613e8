"""``onnx2jax data``: the example models and inputs that ship inside onnx2jax, for commands run from any folder.

``onnx2jax data`` lists them with their paths; ``onnx2jax data NAME`` prints one path (for a shell:
``onnx2jax run "$(onnx2jax data tiny_llama)"``). Any command that takes a model or an input file also
takes ``data:NAME`` in its place::

    onnx2jax run data:tiny_llama --input data:tiny_llama.inputs.npz --check
    onnx2jax generate data:llama_gqa --prompt-ids 1,2,3 --max-new-tokens 4
"""

from __future__ import annotations

import argparse

from onnx2jax import bundled
from onnx2jax.cli import console as terminal


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``data`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "data",
        help="list the example models that ship with onnx2jax, or print one's path (data:NAME in any command)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="print this file's path only (tiny_llama stands for tiny_llama.onnx)")
    return parser


def run(args: argparse.Namespace) -> int:
    """Prints one path (NAME given) or every shipped file with its path and what it is."""
    if args.name is not None:
        print(bundled.data_path(bundled.find(args.name)))  # FileNotFoundError lists what ships
        return 0
    console = terminal.make_console()
    for name in bundled.FILES:
        console.print(f"data:{name}  {bundled.DESCRIPTIONS[name]}\n    {bundled.data_path(name)}", markup=False)
    return 0
