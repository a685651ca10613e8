"""``onnx2jax targets``: the TPU topologies ``--target`` (and ``onnx2jax.compile(..., target=)``) compiles for.

Each is looked up in libtpu (the TPU compiler, ``pip install 'jax[tpu]'``), which gives compile-only devices
on this machine: the line says how many devices the topology has and their kind, or why libtpu refused it.
Names are jax's: ``tpu:v5e:2x4`` is eight v5e chips in a 2 x 4 torus; ``--slices N`` compiles for N of them::

    onnx2jax targets
    onnx2jax check model.onnx --target tpu:v5e:2x4 --input-shape input_ids=1,2048
"""

from __future__ import annotations

import argparse
import json

from onnx2jax.cli import console as terminal
from onnx2jax.cli.errors import CliError


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Adds ``targets`` to the ``onnx2jax`` parser."""
    parser = sub.add_parser(
        "targets",
        help="list the TPU topologies --target compiles for (libtpu's compile-only devices)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of lines")
    return parser


def run(args: argparse.Namespace) -> int:
    """Prints each known target with its device count and kind as libtpu gives them."""
    from onnx2jax.errors import TargetError
    from onnx2jax.runtime import targets

    if not targets.libtpu_available():
        raise CliError(f"no target without the TPU compiler: {targets.INSTALL_HINT}")
    rows = []
    for name in targets.list_targets():
        try:
            devices = targets.parse_target(name).devices()
            rows.append({"target": name, "devices": len(devices), "kind": devices[0].device_kind})
        except TargetError as e:
            rows.append({"target": name, "devices": None, "kind": None, "error": e.reason})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    console = terminal.make_console()
    for row in rows:
        if row["devices"] is None:
            console.print(f"{row['target']:<18} not known to this libtpu: {row['error']}", markup=False)
        else:
            console.print(f"{row['target']:<18} {row['devices']:>4} devices  {row['kind']}", markup=False)
    return 0
