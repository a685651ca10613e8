"""Activation functions: Relu, Gelu, Sigmoid, Softplus, Elu, Selu, HardSwish, Mish, PRelu, ..."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register


def _zero(x):
    return jnp.zeros((), jnp.asarray(x).dtype)


def _const(value, x):
    """An attribute value in ``x``'s dtype (attributes are Python floats)."""
    return jnp.asarray(value, jnp.asarray(x).dtype)


@register("Relu", 1, 6, 13, 14)
def relu(x, *, consumed_inputs=None):
    return jnp.maximum(x, _zero(x))


@register("LeakyRelu", 1, 6, 16)
def leaky_relu(x, *, alpha, consumed_inputs=None):
    return jnp.where(x < 0, x * _const(alpha, x), x)


@register("PRelu", 7, 9, 16)
def prelu(x, slope):
    return jnp.where(x < 0, x * slope, x).astype(jnp.asarray(x).dtype)


@register("PRelu", 1, 6)
def prelu_6(x, slope, *, consumed_inputs=None):
    # Before opset 7 the slope has one element (shared) or X's own shape.
    slope = jnp.asarray(slope)
    if slope.size == 1:
        slope = slope.reshape(())
    elif slope.shape != jnp.shape(x):
        raise ValueError(f"PRelu-6 slope must have one element or X's shape {jnp.shape(x)}, got {slope.shape}")
    return prelu(x, slope)


@register("ThresholdedRelu", 10, 22)
def thresholded_relu(x, *, alpha):
    return jnp.where(x > _const(alpha, x), x, _zero(x))


@register("Elu", 1, 6, 22)
def elu(x, *, alpha, consumed_inputs=None):
    return jnp.where(x > 0, x, _const(alpha, x) * jnp.expm1(x))


@register("Celu", 12, 28)
def celu(x, *, alpha):
    a = _const(alpha, x)
    return jnp.maximum(x, _zero(x)) + jnp.minimum(_zero(x), a * jnp.expm1(x / a))


@register("Selu", 1, 6, 22)
def selu(x, *, alpha, gamma, consumed_inputs=None):
    return _const(gamma, x) * jnp.where(x > 0, x, _const(alpha, x) * jnp.expm1(x))


@register("Sigmoid", 1, 6, 13)
def sigmoid(x, *, consumed_inputs=None):
    return jax.nn.sigmoid(x)


@register("HardSigmoid", 1, 6, 22)
def hard_sigmoid(x, *, alpha, beta, consumed_inputs=None):
    y = _const(alpha, x) * x + _const(beta, x)
    return jnp.clip(y, _zero(x), _const(1, x))


@register("HardSwish", 14, 22)
def hard_swish(x):
    return x * jnp.clip(x * _const(1 / 6, x) + _const(0.5, x), _zero(x), _const(1, x))


@register("Tanh", 1, 6, 13)
def tanh(x, *, consumed_inputs=None):
    return jnp.tanh(x)


@register("Softplus", 1, 22)
def softplus(x):
    return jnp.logaddexp(x, _zero(x))


@register("Softsign", 1, 22)
def softsign(x):
    return x / (_const(1, x) + jnp.abs(x))


@register("Mish", 18, 22)
def mish(x):
    return x * jnp.tanh(jnp.logaddexp(x, _zero(x)))


@register("Gelu", 20)
def gelu(x, *, approximate):
    if approximate == "tanh":
        return jax.nn.gelu(x, approximate=True)
    if approximate == "none":
        return jax.nn.gelu(x, approximate=False)
    raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")


@register("Swish", 24)
def swish(x, *, alpha):
    return x * jax.nn.sigmoid(_const(alpha, x) * x)


@register("SwiGLU", 28)
def swiglu(a, b, *, alpha):
    if jnp.shape(a) != jnp.shape(b):
        raise ValueError(f"SwiGLU inputs must have the same shape, got {jnp.shape(a)} and {jnp.shape(b)}")
    return a * jax.nn.sigmoid(_const(alpha, a) * a) * b


@register("Shrink", 9)
def shrink(x, *, bias, lambd):
    x = jnp.asarray(x)
    # Integer inputs compare and shift in floating point, as ONNX's reference does (an
    # unsigned x is never below -lambd), and the result is cast back.
    wide = x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jax.dtypes.canonicalize_dtype(jnp.float64))
    lam, b = _const(lambd, wide), _const(bias, wide)
    out = jnp.where(wide < -lam, wide + b, jnp.where(wide > lam, wide - b, _zero(wide)))
    return out.astype(x.dtype)
