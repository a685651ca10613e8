"""Shape and layout ops: Reshape, Transpose, Squeeze/Unsqueeze, Flatten, Shape, Size, Expand, Tile, Concat, Split, Slice, Pad, DepthToSpace, SpaceToDepth."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
