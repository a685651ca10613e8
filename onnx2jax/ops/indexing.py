"""Indexing: Gather, GatherElements, GatherND, Scatter*, OneHot, Compress, NonZero, Trilu, Where-free selection helpers."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
