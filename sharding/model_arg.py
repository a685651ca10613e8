"""The models the public functions of `sharding` accept: a ModelProto, a path, bytes, or an onnx_ir.Model.

Like `onnx2jax.translate` and `onnx2jax.compile`, the checker takes a path
as readily as a proto. Annotations and shapes are all it reads, so a path's
external weights are left on disk. An ``onnx_ir.Model`` (onnx-ir reads and
writes these annotations too) is serialized to a proto; onnx_ir is imported
only when one is passed. `takes_model` gives a function all of this at once:
a function that returns a new model (`megatron_plan`) returns an
``onnx_ir.Model`` to a caller that gave one, and one that edits the model in
place (`set_spec`, `annotate_tensor`...) writes the new annotations back into
the caller's ``onnx_ir.Model``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar, Union

import onnx

class ModelLoadError(ValueError):
    """The model file, or its external data, cannot be read safely; or its graph cannot be run at all (a cycle).

    Defined here, jax-free, so that ``sharding`` raises it too; ``onnx2jax.errors.ModelLoadError`` is this class.
    """


ModelArg = Union[onnx.ModelProto, str, os.PathLike, bytes, Any]


def as_model_proto(model: ModelArg) -> onnx.ModelProto:
    """Returns ``model`` as a ModelProto (the same object when it is one).

    Raises:
        FileNotFoundError: a path that does not exist.
        TypeError: an object that is none of the accepted kinds.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        return onnx.load(os.fspath(model), load_external_data=False)
    if isinstance(model, bytes):
        return onnx.load_from_string(model)
    if type(model).__module__.startswith("onnx_ir"):
        import onnx_ir

        if isinstance(model, onnx_ir.Model):
            old = model.ir_version  # onnx_ir drops the annotations below IR version 11
            model.ir_version = max(old or 0, 11)
            try:
                return onnx_ir.to_proto(model)
            finally:
                model.ir_version = old
    raise TypeError(
        f"expected a ModelProto, a path, bytes or an onnx_ir.Model; got {type(model).__name__}"
    )


def _is_ir_model(model: object) -> bool:
    if not type(model).__module__.startswith("onnx_ir"):
        return False
    import onnx_ir

    return isinstance(model, onnx_ir.Model)


def _write_back(proto: onnx.ModelProto, model: Any) -> None:
    """Copies ``proto``'s device configurations and node annotations into the onnx_ir.Model ``model``.

    onnx_ir's annotations point at its own objects (a `ModelConfiguration`, a
    graph `Value`), so those of a model read from ``proto`` are re-pointed at
    ``model``'s before they are set.
    """
    import onnx_ir

    fresh = onnx_ir.from_proto(proto)
    old = {c.name: c for c in model.device_configurations}
    configs = {}
    for c in fresh.device_configurations:
        mine = old.get(c.name)
        configs[c.name] = mine if mine is not None and mine == c else c
    values = {v.name: v for v in model.graph.initializers.values()}
    values.update({v.name: v for v in model.graph.inputs})
    for node in model.graph:
        values.update({v.name: v for v in (*node.inputs, *node.outputs) if v is not None})
    ours, theirs = list(model.graph), list(fresh.graph)
    if [n.name for n in ours] != [n.name for n in theirs]:
        raise ValueError("the onnx_ir.Model's nodes changed while it was annotated; annotate a ModelProto instead")
    for node, done in zip(ours, theirs, strict=True):
        node.device_configurations = tuple(
            dataclasses.replace(
                c,
                configuration=configs[c.configuration.name] if c.configuration is not None else None,
                sharding_specs=tuple(
                    dataclasses.replace(spec, value=values.get(spec.value.name) if spec.value is not None else None)
                    for spec in c.sharding_specs
                ),
            )
            for c in done.device_configurations
        )
    model.device_configurations = tuple(configs.values())
    model.ir_version = max(model.ir_version or 0, proto.ir_version)


F = TypeVar("F", bound=Callable[..., Any])


def takes_model(*, in_place: bool = False) -> Callable[[F], F]:
    """Lets a function of a ModelProto (its first argument) take any `ModelArg`.

    Args:
        in_place: The function edits the model it is given. An
            ``onnx_ir.Model`` then gets the new annotations written back (only
            when the function returns normally); a path or bytes is refused
            (there is no model of the caller's to edit).

    A ModelProto returned by the function comes back as an ``onnx_ir.Model``
    to a caller that passed one.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(model: ModelArg, *args: Any, **kwargs: Any) -> Any:
            ir_model = _is_ir_model(model)
            if in_place and not ir_model and not isinstance(model, onnx.ModelProto):
                raise TypeError(
                    f"{func.__name__} edits a model in place: pass a ModelProto or an onnx_ir.Model "
                    f"(onnx.load it first), not {type(model).__name__}"
                )
            proto = as_model_proto(model)
            result = func(proto, *args, **kwargs)
            if ir_model and in_place:
                _write_back(proto, model)
            if ir_model and isinstance(result, onnx.ModelProto):
                import onnx_ir

                return onnx_ir.from_proto(result)
            return result

        return wrapper  # type: ignore[return-value]

    return decorate
