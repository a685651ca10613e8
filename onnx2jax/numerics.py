"""How a program computes: the precision of its matrix products and the platform it is compiled for.

Every dot onnx2jax emits (MatMul, Gemm, Einsum, attention, convolution, the
sharded products of :mod:`onnx2jax.runtime`) takes its ``precision`` from
:func:`dot_precision`, which reads the setting of the model being traced
(``onnx2jax.compile(..., precision=...)``, ``onnx2jax.translate(..., precision=...)``)
and the platform the program is compiled for (:func:`platform`).

Precision settings (``PRECISIONS``):

- ``"auto"`` (the default): ONNX's float32 fidelity, ``HIGHEST``, on CPU and GPU,
  and for float32 operands on a TPU; ``DEFAULT`` (one bf16 pass of the MXU) on a
  TPU when every float operand of the product is bfloat16 or narrower, where more
  passes add nothing a bf16 model can hold.
- ``"highest"``: ``HIGHEST`` everywhere (float32 products as float32: six bf16 passes on a TPU).
- ``"high"``: ``HIGH`` (three bf16 passes on a TPU: about bf16x3, near float32).
- ``"default"``: ``DEFAULT`` everywhere (one bf16 pass on a TPU, TF32 on recent GPUs;
  exact float32 on CPU, where XLA has no faster product).

The platform of a program is that of its mesh's devices (compile-only TPU
devices included), set by the program that traces (:func:`on_platform`); a
model traced outside one reads an enclosing ``jax.set_mesh``'s devices, else
``jax.default_backend()``.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import numpy as np

PRECISIONS = ("auto", "highest", "high", "default")
"""The values of the ``precision`` option (module docstring)."""

_FIXED = {
    "highest": jax.lax.Precision.HIGHEST,
    "high": jax.lax.Precision.HIGH,
    "default": jax.lax.Precision.DEFAULT,
}

_PRECISION: contextvars.ContextVar[str] = contextvars.ContextVar("onnx2jax_precision", default="auto")
_PLATFORM: contextvars.ContextVar[str | None] = contextvars.ContextVar("onnx2jax_platform", default=None)


def checked_precision(setting: str) -> str:
    """``setting`` lower-cased when it is one of ``PRECISIONS``.

    Raises:
      ValueError: another value, naming the accepted ones.
    """
    value = str(setting).lower()
    if value not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(map(repr, PRECISIONS))}, got {setting!r}")
    return value


@contextlib.contextmanager
def precision_scope(setting: str) -> Iterator[None]:
    """Products traced inside take their precision from ``setting`` (one of ``PRECISIONS``)."""
    token = _PRECISION.set(checked_precision(setting))
    try:
        yield
    finally:
        _PRECISION.reset(token)


@contextlib.contextmanager
def on_platform(name: str | None) -> Iterator[None]:
    """The program traced inside is compiled for ``name`` ("cpu", "gpu", "tpu"; None: found as :func:`platform` says)."""
    token = _PLATFORM.set(name)
    try:
        yield
    finally:
        _PLATFORM.reset(token)


def platform() -> str:
    """The platform of the program being traced: :func:`on_platform`'s, else that of the devices of the mesh
    it is traced under (``jax.set_mesh``, ``jax.sharding.use_abstract_mesh``), else ``jax.default_backend()``."""
    named = _PLATFORM.get()
    if named is not None:
        return named
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)  # works inside jax.jit too
    if device is not None and device.platform:
        return device.platform
    return jax.default_backend()


def _narrow(dtype: Any) -> bool:
    """Whether a float dtype has a bf16 (or narrower) significand, so one bf16 pass computes its products."""
    dtype = np.dtype(dtype)
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).nmant <= jnp.finfo(jnp.bfloat16).nmant


def dot_precision(*operands: Any) -> jax.lax.Precision:
    """The ``precision`` of a product of ``operands`` in the program being traced (module docstring)."""
    setting = _PRECISION.get()
    if setting != "auto":
        return _FIXED[setting]
    floats = [np.dtype(x.dtype) for x in operands if jnp.issubdtype(np.dtype(x.dtype), jnp.floating)]
    if platform() == "tpu" and floats and all(_narrow(d) for d in floats):
        return jax.lax.Precision.DEFAULT
    return jax.lax.Precision.HIGHEST
