"""Normalisations: BatchNormalization, InstanceNormalization, LayerNormalization, RMSNormalization, GroupNormalization, LpNormalization, LRN."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
