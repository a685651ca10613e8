"""The one place the serving engine touches the loaded model: :class:`ModelSource`.

Everything the model runner needs of a decoder comes through this adapter, built from the load-once handle
:func:`onnx2jax.load` (:class:`onnx2jax.runtime.decoder.Decoder`): its cache layout, its parameters as placed,
its forward on named inputs and a past (the handle's pure ``apply``, sharded as compiled), the x64 scope its
int64 inputs need, and, tensor-parallel, the mesh and the mesh axes the plan splits the cache's KV heads over.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, ContextManager

import jax
import jax.numpy as jnp

from onnx2jax.runtime.kv_cache import CacheLayout
from onnx2jax.runtime.logit_positions import LOGIT_POSITIONS


@dataclasses.dataclass
class ModelSource:
    """A decoder as the model runner drives it.

    Attributes:
      layout: where the cache is and how the graph's inputs are named.
      params: the parameters, placed.
      forward: ``(params, past: tuple, at, **named inputs) -> (logits [B, vocabulary] at position ``at`` [B] of
        each row's input, presents)``; traceable. Where the handle's graph lets it
        (:mod:`onnx2jax.runtime.logit_positions`), the LM head projects only those positions: a prefill chunk's
        other positions' logits are never computed.
      x64: a context manager entered while tracing and calling the model's programs.
      vocab_size: the logits' last axis.
      context_length: the longest sequence the model takes (None: unknown).
      name: the model's name for messages and the server's model list.
      mesh: the handle's mesh (one device: a mesh of one); the runner places its arrays on it, as the
        programs return them (so that no call sees a new placement and compiles again).
      heads_axes: the mesh axes the cache's KV heads are split over (None: whole on every device).
      devices: the tensor-parallel width.
      note: where the cache is not split over every device, how it is placed; else "".
      target: the TPU target the handle was loaded for (``onnx2jax.load(..., target=)``), whose devices are not
        attached: ``params`` are then ShapeDtypeStructs and the runner's programs only lower (None: placed).
    """

    layout: CacheLayout
    params: Any
    forward: Callable[..., tuple[jax.Array, tuple]]
    x64: Callable[[], ContextManager]
    vocab_size: int
    context_length: int | None
    name: str
    mesh: Any = None
    heads_axes: Any = None
    devices: int = 1
    note: str = ""
    target: str | None = None


def open_model(model: Any, *, devices: int | None = None, target: str | None = None) -> ModelSource:
    """A :class:`ModelSource` for a genai folder, an .onnx path or a handle of :func:`onnx2jax.load`, on
    ``devices`` devices (tensor-parallel, as :func:`onnx2jax.load` plans it), or for a TPU ``target`` that is not
    attached (``"tpu:v5e:2x4"``: its parameters abstract, nothing placed).

    Raises:
      ValueError: a model without a KV cache (serving needs one).
    """
    from onnx2jax.runtime.decoder import Decoder
    from onnx2jax.runtime.load import load

    handle = model if isinstance(model, Decoder) else load(model, devices=devices, target=target)
    layout = handle.layout
    if layout.kind == "none":
        raise ValueError(
            f"{layout.source}: the model has no KV cache inputs; serving needs a cache (export it with one)"
        )
    dtypes = {i.name: i.dtype for i in handle.model.inputs}

    def forward(params, past: tuple, at, **named):
        values = {n: v.astype(dtypes[n]) if dtypes.get(n) is not None else v for n, v in named.items()}
        values.update(zip(layout.past, past))
        if LOGIT_POSITIONS in dtypes:  # the LM head at each row's one position only
            values[LOGIT_POSITIONS] = at.astype(dtypes[LOGIT_POSITIONS])[:, None, None]
        outputs = dict(zip(handle.model.output_names, handle.apply(params, **values)))
        logits = outputs[layout.logits]
        if LOGIT_POSITIONS not in dtypes:
            logits = jnp.take_along_axis(logits, at.astype(jnp.int32)[:, None, None], axis=1)
        return logits[:, 0], tuple(outputs[n] for n in layout.present)

    name = os.path.basename(os.path.normpath(os.fspath(model))) if isinstance(model, (str, os.PathLike)) else "model"
    mesh, heads = handle.compiled.mesh, None
    if handle.devices > 1:
        sharding = handle.placement.abstract_cache(1, 1)[0].sharding  # the cache as the plan places it
        heads = (tuple(sharding.spec) + (None,) * 4)[1]
    return ModelSource(
        layout=layout, params=handle.params if target is None else handle.compiled.abstract_params,
        forward=forward, x64=handle.x64,
        vocab_size=_vocab_size(handle, layout), context_length=layout.context_length, name=name,
        mesh=mesh, heads_axes=heads, devices=handle.devices, note=handle.placement.note, target=target,
    )


def _vocab_size(handle: Any, layout: CacheLayout) -> int:
    """The logits' last axis, from the graph's output shape."""
    output = next(o for o in handle.model.proto.graph.output if o.name == layout.logits)
    dim = output.type.tensor_type.shape.dim[-1]
    if not dim.HasField("dim_value"):
        raise ValueError(f"the vocabulary size (the last axis of {layout.logits!r}) is not fixed by the graph")
    return int(dim.dim_value)
