"""Serving many users: continuous batching over a paged KV cache (:class:`Engine`) behind an OpenAI-compatible
HTTP server (:mod:`onnx2jax.serving.server`, ``onnx2jax serve``). Layers, one module each: the model source
(:mod:`~onnx2jax.serving.source`), the model runner (:mod:`~onnx2jax.serving.runner`), the scheduler
(:mod:`~onnx2jax.serving.scheduler`), the engine (:mod:`~onnx2jax.serving.engine`), the server."""

from onnx2jax.serving.engine import Engine
from onnx2jax.serving.params import SamplingParams

__all__ = ["Engine", "SamplingParams"]
