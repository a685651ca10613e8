"""The inputs ``onnx2jax run`` feeds a model: read from .npy/.npz files, or drawn at random.

Random inputs must be inputs the model accepts: integer ids that index an
embedding (a ``Gather`` whose data is an initializer) are drawn below that
table's row count, masks (integer or bool inputs named ``*mask*``) are all
ones, and every symbolic dim gets the size the user set with ``--dim`` or 2,
which is said (``run``: and named again if the run then fails; ``export``
refuses instead, naming the dims, since its artifact would take that size
only). Each choice is returned as a note for the user to read.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from onnx2jax.cli.errors import CliError, UsageError
from onnx2jax.input_checks import index_uses

DEFAULT_DIM = 2
DEFAULT_INT_RANGE = 16


@dataclasses.dataclass
class Inputs:
    """The values for a run, and one note per choice made for the user (a default, a conversion).

    ``defaulted``: the symbolic dims no ``--dim`` sized, which took `DEFAULT_DIM`.
    """

    values: dict[str, np.ndarray]
    notes: list[str]
    defaulted: list[str] = dataclasses.field(default_factory=list)


def defaulted_dims_hint(defaulted: Sequence[str]) -> str:
    """What to say when a run on defaulted symbolic dims fails: which dims to size, with ``--dim``."""
    listed = ", ".join(map(repr, defaulted))
    options = " ".join(f"--dim {name}=N" for name in defaulted)
    noun = "dim" if len(defaulted) == 1 else "dims"
    return f"symbolic {noun} {listed} took {DEFAULT_DIM}, as no --dim sized {'it' if len(defaulted) == 1 else 'them'}: give the sizes the model expects ({options})"


def parse_dims(items: Sequence[str], symbolic: Sequence[str]) -> dict[str, int]:
    """``--dim NAME=INT`` options; a name that is not a symbolic dim of the model is a usage error."""
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise UsageError(f"--dim expects NAME=INT with INT >= 1, got {item!r}")
        if name not in symbolic:
            known = ", ".join(symbolic) if symbolic else "none: every dim is fixed"
            raise UsageError(f"--dim {name}: the model has no symbolic dim {name!r} (its symbolic dims: {known})")
        dims[name] = int(value)
    return dims


def symbolic_dims(model) -> list[str]:
    """The names of the symbolic dims of a translated model's inputs, in order of appearance."""
    names: list[str] = []
    for info in model.inputs:
        for d in info.shape or ():
            if isinstance(d, str) and d not in names:
                names.append(d)
    return names


def read_input_files(items: Sequence[str], input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """``--input`` options: ``NAME=FILE.npy``, ``NAME=FILE.npz`` (one array, or a key NAME) or ``FILE.npz``.

    A bare ``.npz`` holds arrays named after the model's inputs (the fixtures'
    ``*.inputs.npz``). Unknown names are usage errors that list the inputs.
    """
    values: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep:
            name, path = "", item
            if not path.endswith(".npz"):
                raise UsageError(f"--input expects NAME=FILE.npy or FILE.npz, got {item!r}")
        arrays = _read_arrays(path)
        if name:
            if name not in input_names:
                raise UsageError(f"--input {name}: the model has no input {name!r}; its inputs: {', '.join(input_names)}")
            if len(arrays) == 1:
                values[name] = next(iter(arrays.values()))
            elif name in arrays:
                values[name] = arrays[name]
            else:
                raise CliError(f"{path} holds {sorted(arrays)}, none of them {name!r}; give FILE.npz without NAME=")
        else:
            unknown = sorted(set(arrays) - set(input_names))
            if unknown:
                raise UsageError(f"--input {path}: arrays {unknown} are not inputs of the model ({', '.join(input_names)})")
            values.update(arrays)
    return values


def _read_arrays(path: str) -> dict[str, np.ndarray]:
    if not os.path.isfile(path):
        raise CliError(f"no such file: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise CliError(f"{path} is not a .npy or .npz file numpy can read without pickle: {e}") from e
    if isinstance(loaded, np.ndarray):
        return {"": loaded}
    with loaded:
        return {key: loaded[key] for key in loaded.files}


def conform(values: Mapping[str, np.ndarray], model) -> Inputs:
    """Converts given arrays to the model's input dtypes where no value changes (int32 -> int64 ...), with a note.

    An array of the wrong rank, or not matching a fixed dim, is the user's mistake: a `CliError` naming the
    input and the dims the model declares.
    """
    out: dict[str, np.ndarray] = {}
    notes: list[str] = []
    declared = {info.name: info.dtype for info in model.inputs}
    shapes = {info.name: info.shape for info in model.inputs}
    for name, value in values.items():
        _require_shape(name, value.shape, shapes.get(name))
        want = declared.get(name)
        if want is None or value.dtype == want:
            out[name] = value
            continue
        converted = value.astype(want)
        same_kind = value.dtype.kind in "iub" and want.kind in "iub" or value.dtype.kind == want.kind == "f"
        if not same_kind or not np.array_equal(converted.astype(value.dtype), value):
            raise CliError(f"input {name!r} is {value.dtype} but the model wants {want}, and converting changes values; "
                           f"save it as {want}")
        notes.append(f"input {name!r}: converted {value.dtype} -> {want} (the model's dtype)")
        out[name] = converted
    return Inputs(out, notes)


def _require_shape(name: str, shape: tuple[int, ...], declared: tuple | None) -> None:
    if declared is None:
        return
    dims = "[" + ", ".join("?" if d is None else str(d) for d in declared) + "]"
    if len(shape) != len(declared):
        raise CliError(f"input {name!r} has shape {list(shape)} (rank {len(shape)}) but the model declares "
                       f"rank {len(declared)}: {dims}")
    for axis, (want, got) in enumerate(zip(declared, shape)):
        if isinstance(want, int) and want > 0 and want != got:
            raise CliError(f"input {name!r} has shape {list(shape)} but the model declares {dims}: "
                           f"axis {axis} must be {want}")


def random_inputs(
    model,
    seed: int = 0,
    dims: Mapping[str, int] | None = None,
    skip: Sequence[str] = (),
    symbolic: Sequence[str] = (),
) -> Inputs:
    """Random inputs of the model's declared types, for the inputs not in ``skip``.

    Integer inputs that index an embedding are drawn in [0, rows); other
    integers in [0, 16); masks are ones; floats standard normal. Symbolic dims
    take ``dims`` or 2. Every such choice comes back as a note.

    An input with a dim of ``symbolic`` (those ``onnx2jax export`` keeps
    symbolic) stands only for its shape and dtype: nothing is drawn for it
    (zeros, at size 2 on those dims), and its note names the dims it keeps.
    """
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    kept = set(symbolic)
    bounds = index_bounds(model.proto)
    values: dict[str, np.ndarray] = {}
    notes: list[str] = []
    defaulted: list[str] = []
    for info in model.inputs:
        if info.name in skip:
            continue
        shape, shown = [], []
        for d in info.shape or ():
            if isinstance(d, int) and d > 0:
                shape.append(d)
            elif d in kept:
                shape.append(DEFAULT_DIM)
            else:
                name = d if isinstance(d, str) else "?"
                if name not in dims:
                    dims[name] = DEFAULT_DIM
                    defaulted.append(name)
                shape.append(dims[name])
            shown.append(d if d in kept else shape[-1])
        shape = tuple(shape)
        dtype = info.dtype or np.dtype(np.float32)
        masked = "mask" in info.name.lower()
        keeps = [d for d in dict.fromkeys(info.shape or ()) if d in kept]
        if keeps:
            values[info.name] = np.zeros(shape, dtype)
            listed = ", ".join(map(repr, keeps))
            notes.append(f"input {info.name!r} {dtype} ({', '.join(map(str, shown))}): its shape and dtype only, "
                         f"no values drawn ({listed} kept symbolic)")
            continue
        if dtype.kind == "b" or (dtype.kind in "iu" and masked):
            values[info.name] = np.ones(shape, dtype)
            what = "all ones (a mask)"
        elif dtype.kind in "iu":
            high, source = bounds.get(info.name, (DEFAULT_INT_RANGE, None))
            values[info.name] = rng.integers(0, high, shape).astype(dtype)
            what = f"random integers in [0, {high})" + (f", the rows of {source!r}" if source else "")
        else:
            values[info.name] = rng.standard_normal(shape).astype(dtype)
            what = "random normal"
        notes.append(f"input {info.name!r} {dtype} {shape}: {what}")
    defaulted = list(dict.fromkeys(defaulted))
    for name in defaulted:
        notes.append(f"symbolic dim {name!r} = {DEFAULT_DIM} (set it with --dim {name}=N)")
    return Inputs(values, notes, defaulted)


def index_bounds(proto: onnx.ModelProto) -> dict[str, tuple[int, str]]:
    """For each graph input that indexes a table (:mod:`onnx2jax.input_checks`): (the smallest size, the table)."""
    bounds: dict[str, tuple[int, str]] = {}
    for use in index_uses(proto):
        size = min(use.bounds)
        if use.input not in bounds or size < bounds[use.input][0]:
            bounds[use.input] = (size, use.table)
    return bounds
