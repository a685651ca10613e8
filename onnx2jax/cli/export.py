"""onnx2jax export: compile a model (sharded when annotated) and write it as a portable jax.export artifact.

The artifact (``onnx2jax.export``) holds the sharded program at one input
signature and its parameters; ``onnx2jax.export.load(path)(inputs)`` runs it
with jax alone. The example inputs come from ``--input`` files or are drawn
at random as ``onnx2jax run`` draws them; every symbolic dim of a drawn input
needs ``--dim`` (a size, or ``symbolic``): an artifact at a size nobody chose
would take that size only, so none is assumed and the missing ones are named.
``--dim NAME=symbolic`` keeps one of the model's symbolic dims symbolic in the
artifact (jax.export shape polymorphism): one artifact then serves every size
of it, e.g. every batch. A shape computation whose result depends on a symbolic
dim's value is refused, naming the node; ``--constraint`` says what holds
(BERT's positions, sliced from a 512-row table, need ``seq <= 512``).

Examples::

    onnx2jax export llama_tp8.onnx -o llama.jaxexport --dim batch=4 --dim seq=128
    onnx2jax export llama_tp8.onnx -o llama.jaxexport --dim batch=symbolic --dim seq=128
    onnx2jax export bert.onnx -o bert.jaxexport --dim batch=symbolic --dim seq=symbolic --constraint "seq <= 512"
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Mapping, Sequence

from onnx2jax.cli import console as terminal  # terminal.make_console at call time, as run does
from onnx2jax.cli.errors import UsageError
from onnx2jax.cli.options import add_target_arguments, target_of
from onnx2jax.cli.inputs import conform, parse_dims, random_inputs, read_input_files, symbolic_dims

SYMBOLIC = "symbolic"


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = sub.add_parser("export", help="write a compiled model as a jax.export artifact", description=__doc__)
    parser.add_argument("model", help="the .onnx file (annotated for a mesh or not)")
    parser.add_argument("-o", "--output", required=True, metavar="OUT.jaxexport", help="the artifact to write")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                        help="an example input from a file (the others are drawn at random)")
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=INT|symbolic",
                        help="size of a symbolic dim, or 'symbolic' to keep it symbolic in the artifact (each symbolic dim "
                        "of an input not given by --input needs one)")
    parser.add_argument("--constraint", action="append", default=[], metavar="EXPR",
                        help="what holds for the symbolic dims, as jax.export reads it (e.g. 'seq <= 512'): "
                        "decides the shape comparisons that depend on them")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    add_target_arguments(parser)
    return parser


def unsized_dims_message(names: Sequence[str]) -> str:
    """The refusal of an export whose symbolic dims no ``--dim`` (nor ``--input`` file) sized, naming each."""
    listed = ", ".join(map(repr, names))
    sized = " ".join(f"--dim {n}=N" for n in names)
    kept = " ".join(f"--dim {n}=symbolic" for n in names)
    noun = "dim" if len(names) == 1 else "dims"
    verb = "has" if len(names) == 1 else "have"
    return (f"symbolic {noun} {listed} of the model {verb} no size: give {sized} for an artifact of that size, "
            f"or {kept} for one that takes every size")


def split_symbolic(items: Sequence[str], known: Sequence[str]) -> tuple[list[str], list[str]]:
    """``--dim`` options as (the NAME=INT ones, the names set to ``symbolic``).

    Raises:
      UsageError: a name set to ``symbolic`` that is no symbolic dim of the model.
    """
    sized, symbolic = [], []
    for item in items:
        name, _, value = item.partition("=")
        if value != SYMBOLIC:
            sized.append(item)
        elif name not in known:
            listed = ", ".join(known) if known else "none: every dim is fixed"
            raise UsageError(f"--dim {name}: the model has no symbolic dim {name!r} (its symbolic dims: {listed})")
        else:
            symbolic.append(name)
    return sized, symbolic


def symbolic_examples(
    values: Mapping[str, Any], model, names: Sequence[str], constraints: Sequence[str] = ()
) -> dict[str, Any]:
    """``values`` with each axis the model declares as one of ``names`` made jax's symbolic dim of that name.

    An input with such an axis becomes a ``jax.ShapeDtypeStruct`` (its dtype kept); the others stay arrays.
    All share one symbolic scope (with ``constraints``), so that two inputs' ``batch`` is one dim.

    Raises:
      UsageError: a constraint jax cannot read.
    """
    import jax
    import numpy as np

    if not names:
        return dict(values)
    try:
        dims = dict(zip(names, jax.export.symbolic_shape(",".join(names), constraints=tuple(constraints))))
    except ValueError as e:
        raise UsageError(f"--constraint: {e}") from e
    declared = {info.name: tuple(info.shape or ()) for info in model.inputs}
    out = {}
    for name, value in values.items():
        axes = declared.get(name, ())
        shape = tuple(dims.get(d, size) if isinstance(d, str) else size for d, size in zip(axes, np.shape(value)))
        if any(isinstance(d, str) and d in dims for d in axes) and len(axes) == np.ndim(value):
            out[name] = jax.ShapeDtypeStruct(shape, np.asarray(value).dtype)
        else:
            out[name] = value
    return out


def run(args: argparse.Namespace) -> int:
    import onnx2jax
    from onnx2jax.export import export

    console = terminal.make_console()
    # --target: the program lowered for the TPU topology's platform and shardings, to load where it is attached
    # (the artifact carries the weights, read from the model file; nothing is placed here).
    compiled = onnx2jax.compile(args.model, target=target_of(args))
    model = compiled.model
    known = symbolic_dims(model)
    sized, symbolic = split_symbolic(args.dim, known)
    dims = parse_dims(sized, known)
    for name in symbolic:
        if name in dims:
            raise UsageError(f"--dim {name}: both {name}={dims[name]} and {name}=symbolic; a dim kept symbolic "
                             "takes every size, so it has none to set")
    if args.constraint and not symbolic:
        raise UsageError("--constraint constrains symbolic dims: keep one with --dim NAME=symbolic")
    given = conform(read_input_files(args.input, model.input_names), model)
    drawn = random_inputs(model, args.seed, dims, skip=list(given.values), symbolic=symbolic)
    if drawn.defaulted:  # an artifact at a size nobody chose would take that size only
        raise UsageError(unsized_dims_message(drawn.defaulted))
    kept = [f"symbolic dim {n!r} kept symbolic: the artifact takes every size of it" for n in symbolic]
    for note in given.notes + drawn.notes + kept:
        console.print(f"note: {note}", markup=False)
    examples = symbolic_examples({**given.values, **drawn.values}, model, symbolic, args.constraint)
    data = export(compiled, path=args.output, **examples)
    shapes = ", ".join(f"{k} [{', '.join(map(str, v.shape))}]" for k, v in examples.items())
    size = f"{len(data) / 1e6:.1f} MB"
    console.print(f"wrote {os.fspath(args.output)} ({size}): {shapes} on mesh {dict(compiled.mesh.shape)}", markup=False)
    return 0
