"""The one public face of every way of running a model: :class:`Executable`.

After jax's own stages (Traced -> Lowered -> Compiled), whatever
:func:`onnx2jax.compile` returns (one SPMD program, pipeline stages,
segments; next a train step) is called like the model,
holds its placed parameters, offers the pure function of those parameters,
its lowered program(s) and a report.

A way of running that needs more than one call of the model extends the
protocol with its own programs, built over ``apply`` so that they run the
same plan, placements and constraints: the generation handle
(:func:`onnx2jax.load`, :class:`onnx2jax.runtime.decoder.Decoder`) is an
Executable whose ``params``, ``__call__``, ``apply``, ``lower``, ``report`` and
``value_and_grad`` are its compiled model's, with ``prefill`` and ``decode`` programs jitted over
``apply`` and entered through :func:`onnx2jax.x64.x64_scope`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Protocol, runtime_checkable

import jax


@runtime_checkable
class Executable(Protocol):
    """A compiled model.

    Attributes:
      params: the parameters as placed jax.Arrays, by name.
    """

    @property
    def params(self) -> Mapping[str, jax.Array]: ...

    def __call__(self, *inputs: Any, **named: Any) -> tuple:
        """Runs the model; returns jax.Arrays in ONNX output order."""
        ...

    def apply(self, params: Mapping[str, Any], *inputs: Any, **named: Any) -> tuple:
        """The model as a pure function of ``params`` (laid out as :attr:`params`), sharded as compiled."""
        ...

    def lower(self, *inputs: Any, **named: Any) -> Any:
        """The lowered program at these inputs (``jax.stages.Lowered``), or one per part."""
        ...

    def report(self, *inputs: Any, **named: Any) -> Any:
        """What the compiled program(s) do at these inputs: specs, collectives, bytes."""
        ...

    def value_and_grad(self, loss_fn: Callable[..., Any]) -> Callable[..., tuple]:
        """``(params, *inputs, loss_args=(), **named) -> (loss, grads)``: the loss ``loss_fn(outputs, *loss_args)``
        and its gradient over ``params`` (a subset of :attr:`params`, laid out alike; a name that is not one is a
        ``ParameterError``), each gradient placed like its parameter.

        Offered by one SPMD program (:class:`~onnx2jax.runtime.spmd.Compiled`: jitted
        ``jax.value_and_grad`` over ``apply``), pipeline stages
        (:class:`~onnx2jax.runtime.pipeline.PipelineCompiled`: by its schedule, the loss summed over
        micro-batches) and the generation handle (:class:`~onnx2jax.runtime.decoder.Decoder`: its compiled
        model's, one forward call with the cache inputs given). A segmented run
        (:class:`~onnx2jax.runtime.segmented.SegmentedCompiled`) raises
        :class:`~onnx2jax.errors.NotDifferentiableError` naming its first host step: its data-dependent
        nodes run in numpy between the jitted segments, where no gradient flows.
        """
        ...


def merged_params(parts: Iterable[Executable | None]) -> dict[str, jax.Array]:
    """Every part's parameters by name; a parameter several parts hold: the first part's copy."""
    merged: dict[str, jax.Array] = {}
    for part in parts:
        if part is not None:
            for name, array in part.params.items():
                merged.setdefault(name, array)
    return merged


def part_params(part: Executable, params: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``params`` that ``part`` holds, each moved where the part holds it.

    A part of a pipeline or a segmented run has its own devices: a parameter
    given on another part's devices (``merged_params`` keeps the first copy)
    is moved onto this part's (``jax.device_put`` is differentiable).
    """
    own = part.params
    return {name: jax.device_put(value, own[name].sharding) for name, value in params.items() if name in own}


__all__ = ["Executable", "merged_params", "part_params"]
