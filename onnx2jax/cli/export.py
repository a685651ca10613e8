"""onnx2jax export: compile a model (sharded when annotated) and write it as a portable jax.export artifact.

The artifact (``onnx2jax.export``) holds the sharded program at one input
signature and its parameters; ``onnx2jax.export.load(path)(inputs)`` runs it
with jax alone. The example inputs come from ``--input`` files or are drawn
at random as ``onnx2jax run`` draws them (``--dim`` sizes symbolic dims).

Examples::

    onnx2jax export llama_tp8.onnx -o llama.jaxexport --dim batch=4 --dim sequence=128
"""

from __future__ import annotations

import argparse
import os

from onnx2jax.cli import console as terminal  # terminal.make_console at call time, as run does
from onnx2jax.cli.inputs import conform, parse_dims, random_inputs, read_input_files, symbolic_dims


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("export", help="write a compiled model as a jax.export artifact", description=__doc__)
    parser.add_argument("model", help="the .onnx file (annotated for a mesh or not)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.jaxexport", help="the artifact to write")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an example input from a file (the others are drawn at random)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT",
                        help="size of a symbolic dim (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    return parser


def run(args: argparse.Namespace) -> int:
    import onnx2jax
    from onnx2jax.export import export

    console = terminal.make_console()
    compiled = onnx2jax.compile(args.model)
    model = compiled.model
    dims = parse_dims(args.dim, symbolic_dims(model))
    given = conform(read_input_files(args.input, model.input_names), model)
    drawn = random_inputs(model, args.seed, dims, skip=list(given.values))
    for note in given.notes + drawn.notes:
        console.print(note, markup=False)
    data = export(compiled, path=args.output, **given.values, **drawn.values)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in {**given.values, **drawn.values}.items())
    size = f"{len(data) / 1e6:.1f} MB"
    console.print(f"wrote {os.fspath(args.output)} ({size}): {shapes} on mesh {dict(compiled.mesh.shape)}", markup=False)
    return 0
