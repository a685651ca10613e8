"""How a program computes: the precision of its matrix products, its compute dtype, and its platform.

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

Compute dtype (``compute_dtype="bfloat16"``, or ``"float16"``; None: the model's own types): a float32
export runs in that dtype. Its float32 parameters are held in it (half the bytes), its float32 inputs are
cast to it on entry, every float32 value a node computes is cast to it (:func:`narrowed`: a Cast to float32,
a float constant meeting a bf16 value, an op that computes in float32 inside), and the graph's outputs are
cast back to the types the model declares. Values folded while tracing (positions, shapes) stay as they are,
so a node that reads one computes in float32 before its result is narrowed.

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
_COMPUTE: contextvars.ContextVar[np.dtype | None] = contextvars.ContextVar("onnx2jax_compute_dtype", default=None)

COMPUTE_DTYPES = ("bfloat16", "float16")
"""The values of the ``compute_dtype`` option besides None (module docstring)."""


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


def checked_compute_dtype(setting: Any) -> np.dtype | None:
    """``setting`` as a numpy dtype when it names one of ``COMPUTE_DTYPES`` (None stays None).

    Raises:
      ValueError: another value, naming the accepted ones.
    """
    if setting is None:
        return None
    try:
        dtype = np.dtype(jnp.dtype(setting))
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be None or one of {', '.join(map(repr, COMPUTE_DTYPES))}, got {setting!r}")
    return dtype


@contextlib.contextmanager
def compute_scope(dtype: np.dtype | None) -> Iterator[None]:
    """Float32 values computed inside are narrowed to ``dtype`` (None: kept) by :func:`narrowed`."""
    token = _COMPUTE.set(dtype)
    try:
        yield
    finally:
        _COMPUTE.reset(token)


def narrowed(value: Any) -> Any:
    """``value`` cast to the compute dtype of the program being traced when it is a float32 jax array
    (or a tuple or list of values); anything else (numpy, integers, other floats, sequences of values) as is."""
    dtype = _COMPUTE.get()
    if dtype is None:
        return value
    if isinstance(value, (tuple, list)):
        return type(value)(narrowed(v) for v in value)
    if isinstance(value, jax.Array) and value.dtype == jnp.float32:
        return value.astype(dtype)
    return value
