"""Static slices emitted in canonical form, the one way ops take strided slices.

Why: in jax 0.10.2 XLA's SPMD partitioner mishandles a strided ``slice``
whose limit is not the last taken element + 1 on a sharded axis: ``x[:, 1:2:3]``
on a column-split ``(4, 2)`` array returns column 0, and some such slices
fail its HLO verifier (see docs/known-issues.md, and
tests/onnx2jax/test_known_issues.py, which fails once upstream fixes it).
The canonical form of a slice that takes ``n`` elements from ``start`` every
``stride`` is ``limit = start + (n - 1) * stride + 1``, with stride 1 when
``n == 1``; it selects the same elements, and the partitioner gets it right.

Worked example: ``x[1:2:3]`` on an axis of size 2 takes n = 1 element; the
canonical slice is start 1, limit 2, stride 1. ``x[5:0:-2]`` on size 8 takes
5, 3, 1: the canonical slice takes 1, 3, 5 (start 1, limit 6, stride 2) and
reverses the axis.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np
from jax import lax

from onnx2jax import symbolic


def take(x: Any, index: Sequence[slice]) -> Any:
    """``x[index]`` for a tuple of static slices (one per leading axis), as canonical ``lax.slice``s.

    numpy inputs (values known while tracing) are sliced with numpy, unless a bound is a
    symbolic dimension (jax.export): no numpy array has that size, so jax slices them.
    """
    index = tuple(index) + (slice(None),) * (x.ndim - len(index))
    if isinstance(x, (np.ndarray, np.generic)):
        if not any(symbolic.is_dim(s.start) or symbolic.is_dim(s.stop) for s in index):
            return x[index]
        x = symbolic.as_jax(x) if symbolic.is_symbolic(x) else jnp.asarray(x)
    starts, limits, strides, reverse = [], [], [], []
    for axis, (s, size) in enumerate(zip(index, x.shape)):
        if symbolic.is_dim(size) or symbolic.is_dim(s.start) or symbolic.is_dim(s.stop):
            start, limit = _symbolic_bounds(s, size, axis)
            starts.append(start), limits.append(limit), strides.append(1)
            continue
        start, stop, step = s.indices(size)
        count = len(range(start, stop, step))
        if count == 0:
            starts.append(0), limits.append(0), strides.append(1)
            continue
        if step < 0:  # take the same elements upwards, then reverse the axis
            start, step = start + (count - 1) * step, -step
            reverse.append(axis)
        stride = step if count > 1 else 1
        starts.append(start)
        limits.append(start + (count - 1) * stride + 1)
        strides.append(stride)
    out = lax.slice(x, starts, limits, strides)
    return lax.rev(out, reverse) if reverse else out


def _symbolic_bounds(s: slice, size: Any, axis: int) -> tuple[Any, Any]:
    """Start and limit of a step-1 slice whose axis or bounds hold a symbolic dimension (jax.export),
    already clamped into the axis by the caller (as :mod:`onnx2jax.ops.shapes` does)."""
    if s.step not in (None, 1):
        raise ValueError(f"a slice of step {s.step} on axis {axis} of symbolic size {size} is not supported")
    start = 0 if s.start is None else s.start
    limit = size if s.stop is None else s.stop
    return start, limit
