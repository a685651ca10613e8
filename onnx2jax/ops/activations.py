"""Activation functions: Relu, Gelu, Sigmoid, Softplus, Elu, Selu, HardSwish, Mish, PRelu, ..."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


@register("Relu", 6, 13, 14)
def relu(x):
    return jnp.maximum(x, jnp.zeros((), x.dtype))
