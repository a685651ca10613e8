"""The one place the serving engine touches the loaded model: :class:`ModelSource`.

Everything the model runner needs of a decoder (its cache layout, its parameters on device, its forward on
named inputs and a past, the x64 context its int64 inputs need, its vocabulary and context) comes through this
adapter, built today from :class:`onnx2jax.runtime.decoder.Decoder`. When the load-once handle of issue 28
(``onnx2jax.load``) lands, :func:`open_model` is the one function to switch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ContextManager

import jax

from onnx2jax.runtime.kv_cache import CacheLayout


@dataclasses.dataclass
class ModelSource:
    """A decoder as the model runner drives it.

    Attributes:
      layout: where the cache is and how the graph's inputs are named.
      params: the parameters, on device.
      forward: ``(params, past: tuple, **named inputs) -> (logits, presents)``; traceable.
      x64: a context manager entered while tracing and calling the model's programs.
      vocab_size: the logits' last axis.
      context_length: the longest sequence the model takes (None: unknown).
      name: the model's name for messages and the server's model list.
    """

    layout: CacheLayout
    params: Any
    forward: Callable[..., tuple[jax.Array, tuple]]
    x64: Callable[[], ContextManager]
    vocab_size: int
    context_length: int | None
    name: str


def open_model(model: Any, *, devices: int | None = None) -> ModelSource:
    """A :class:`ModelSource` for a genai folder, an .onnx path, a JaxModel or a Decoder.

    Raises:
      ValueError: a model without a KV cache (serving needs one), or ``devices`` > 1 (not implemented here yet).
    """
    from onnx2jax.runtime.decoder import Decoder

    if devices is not None and devices > 1:
        raise NotImplementedError(
            f"serving tensor-parallel (devices={devices}) is not implemented yet: serve on one device"
        )
    decoder = model if isinstance(model, Decoder) else Decoder(model)
    layout = decoder.layout
    if layout.kind == "none":
        raise ValueError(
            f"{layout.source}: the model has no KV cache inputs; serving needs a cache (export it with one)"
        )
    name = os.path.basename(os.path.normpath(os.fspath(model))) if isinstance(model, (str, os.PathLike)) else "model"
    return ModelSource(
        layout=layout,
        params=decoder.params,
        forward=decoder._forward,  # noqa: SLF001 -- the adapter is the one place that knows the handle
        x64=decoder.x64,
        vocab_size=_vocab_size(decoder, layout),
        context_length=layout.context_length,
        name=name,
    )


def _vocab_size(decoder: Any, layout: CacheLayout) -> int:
    """The logits' last axis, from the graph's output shape."""
    output = next(o for o in decoder.model.proto.graph.output if o.name == layout.logits)
    dim = output.type.tensor_type.shape.dim[-1]
    if not dim.HasField("dim_value"):
        raise ValueError(f"the vocabulary size (the last axis of {layout.logits!r}) is not fixed by the graph")
    return int(dim.dim_value)
