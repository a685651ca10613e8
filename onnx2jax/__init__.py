"""onnx2jax: run ONNX models on JAX/XLA, sharded from ONNX's multi-device annotations."""

from onnx2jax.runtime.spmd import Compiled as Compiled
from onnx2jax.runtime.spmd import compile as compile  # noqa: A001 - onnx2jax.compile(model, mesh)
from onnx2jax.errors import ModelLoadError as ModelLoadError
from onnx2jax.errors import NodeError as NodeError
from onnx2jax.errors import PrecisionError as PrecisionError
from onnx2jax.errors import UnsupportedOpError as UnsupportedOpError
from onnx2jax.loading import load_model as load_model
from onnx2jax.translate import JaxModel as JaxModel
from onnx2jax.translate import translate as translate

__version__ = "0.1.0"
