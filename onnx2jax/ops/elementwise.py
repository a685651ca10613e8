"""Elementwise arithmetic, comparison, logical and bitwise ops, unary math, variadic Sum/Mean/Max/Min."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


@register("Add", 7, 13, 14)
def add(a, b):
    return jnp.add(a, b)


@register("Sub", 7, 13, 14)
def sub(a, b):
    return jnp.subtract(a, b)


@register("Mul", 7, 13, 14)
def mul(a, b):
    return jnp.multiply(a, b)
