"""Tensors made from attributes or shapes: Constant, ConstantOfShape, Range, EyeLike, Random*."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
