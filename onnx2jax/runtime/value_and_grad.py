"""``Compiled.value_and_grad``: the jitted loss and gradients of an SPMD program, callable and lowerable.

Calling it runs on the placed parameters; :meth:`ValueAndGrad.lower` lowers the same program over
``abstract_params`` (ShapeDtypeStructs with their planned shardings), so a training program compiles for a
TPU target whose devices are not attached (issue 41 item 6) and reads no weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import jax

from onnx2jax.trainable import checked_names
from onnx2jax.x64 import x64_scope

if TYPE_CHECKING:
    from onnx2jax.runtime.spmd import Compiled


class ValueAndGrad:
    """``(params, *inputs, loss_args=(), **named) -> (loss, grads)``: ``jax.value_and_grad`` over ``apply``, jitted.

    ``params``: the parameters to differentiate (a subset of the program's, laid out alike); the others are
    the program's own, constants of the trace. One jitted program per value of the shape-setting inputs.
    """

    def __init__(self, compiled: "Compiled", loss_fn: Callable[..., Any]):
        self.compiled, self.loss_fn = compiled, loss_fn
        self._jitted: dict[tuple, Any] = {}

    def _program(self, inputs: Sequence[Any], named: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The jitted program for these inputs' shape-setting values, and the runtime inputs by name."""
        compiled, loss_fn = self.compiled, self.loss_fn
        dynamic, static, key = compiled.model.split_static(compiled.model.bind_inputs(inputs, named))
        found = self._jitted.get(key)
        if found is None:
            def loss(trained, frozen, values, extra):
                return loss_fn(compiled.apply({**frozen, **trained}, **values, **static), *extra)

            found = self._jitted[key] = jax.jit(jax.value_and_grad(loss))
        return found, dynamic

    def __call__(self, params: Mapping[str, Any], *inputs: Any, loss_args: Sequence[Any] = (), **named: Any) -> tuple:
        compiled = self.compiled
        checked_names(params, compiled.params, "value_and_grad")
        with x64_scope(compiled.model.uses_64bit):
            found, dynamic = self._program(inputs, named)
            frozen = {k: v for k, v in compiled.params.items() if k not in params}
            return found(dict(params), frozen, dynamic, tuple(loss_args))

    def lower(
        self, params: Mapping[str, Any], *inputs: Any, loss_args: Sequence[Any] = (), **named: Any
    ) -> jax.stages.Lowered:
        """The program lowered without placing anything: ``params`` (the differentiated ones) as arrays or
        ShapeDtypeStructs (``{k: compiled.abstract_params[k] for k in compiled.trainable}``), the others the
        program's ``abstract_params``; inputs as :meth:`Compiled.lower` takes them (arrays, ShapeDtypeStructs,
        shapes); ``loss_args`` as arrays or ShapeDtypeStructs. Works on a target's compile-only devices."""
        compiled = self.compiled
        abstract = compiled.abstract_params
        checked_names(params, abstract, "value_and_grad")
        with x64_scope(compiled.model.uses_64bit):
            found, dynamic = self._program(compiled._shaped(inputs), compiled._shaped(named))
            frozen = {k: v for k, v in abstract.items() if k not in params}
            return found.lower(dict(params), frozen, dynamic, tuple(loss_args))


__all__ = ["ValueAndGrad"]
