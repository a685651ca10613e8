"""Control flow: If -> lax.cond, Loop -> lax.while_loop/scan, Scan -> lax.scan."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
