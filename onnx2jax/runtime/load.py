"""``onnx2jax.load(model)``: a decoder LLM loaded once, the handle generation runs on (onnxruntime-genai's
``og.Model``).

The generation front door, on the runtime's one path (:mod:`onnx2jax.runtime.plan`, as
:func:`onnx2jax.compile` walks it):

1. open the model once (:func:`onnx2jax.loading.open_model`: external weights stay on disk, memory-mapped);
2. its cache layout (genai_config.json, checked against the graph, or the graph's names); a LongRoPE If on the
   mask's width made to read the real total length (:mod:`onnx2jax.runtime.total_length`);
3. tensor-parallel: its nodes named, ONNX shape inference once, the Megatron plan and the cache's specs
   written into the opened model itself (no copy; :mod:`onnx2jax.runtime.generate_sharding`);
4. the plan (:func:`~onnx2jax.runtime.plan.make_plan`, given that shape inference: not run again), one
   translation, and one SPMD program (:class:`~onnx2jax.runtime.spmd.Compiled`) whose parameters are placed
   slice by slice from the maps: each device reads only its slice, no host copy of the weights. On one device
   it is made here; tensor-parallel, its sharding inference waits for the first prefill's shapes
   (:meth:`Decoder.plan_prefill`, which a ``Generator`` calls when it is made), so that it runs once before
   the first token instead of once at the model's shapes and again at the prefill's.

A handle loaded from a path is remembered, weakly, by (file, its size and time, devices, mesh): loading the same
again (``generate(path)`` twice) returns the same handle while anything holds it, and nothing is kept once the
caller drops it.
"""

from __future__ import annotations

import copy
import os
import weakref
from typing import Any, Hashable

import jax
from jax.sharding import Mesh

from sharding.annotate import name_nodes
from sharding.shapes import infer_model

from onnx2jax import genai_config as _genai
from onnx2jax.errors import DeviceCountError
from onnx2jax.loading import ModelLike, Opened, open_model
from onnx2jax.runtime import kv_cache
from onnx2jax.runtime.decoder import Decoder
from onnx2jax.runtime.generate_sharding import CONFIGURATION, write_plan
from onnx2jax.runtime.logit_positions import gather_logit_positions
from onnx2jax.runtime.plan import make_plan
from onnx2jax.runtime.targets import Target, parse_target
from onnx2jax.runtime.total_length import feed_total_length, mask_width_conditions
from onnx2jax.translate import JaxModel

_LOADED: weakref.WeakValueDictionary[Hashable, Decoder] = weakref.WeakValueDictionary()
"""The handles loaded from paths, while something holds them."""


def load(
    model: ModelLike | JaxModel, *, devices: int | None = None, mesh: Mesh | None = None, target: str | None = None,
) -> Decoder:
    """Loads a decoder LLM once for generation: the handle :func:`onnx2jax.generate` and
    :class:`onnx2jax.Generator` take (onnxruntime-genai's ``og.Model``).

    Args:
      model: a folder with genai_config.json (onnxruntime-genai's model builder) or a model.onnx, an .onnx
        path (a torch export with ``past_key_values``), a ModelProto or bytes, or a JaxModel.
      devices: run tensor-parallel over this many devices (the Megatron plan, the cache split by KV heads);
        None or 1: on one device.
      mesh: run tensor-parallel on this mesh (its size is the width).
      target: plan for a TPU topology that is not attached (``"tpu:v5e:2x4"``): tensor-parallel over its
        chips, a mesh of compile-only devices; the generation programs then lower and compile
        (:meth:`~onnx2jax.runtime.decoder.Decoder.lower_generation`), nothing runs.

    Returns:
      A :class:`~onnx2jax.runtime.decoder.Decoder`: an Executable (``params``, ``__call__``, ``apply``,
      ``lower``, ``report``) with the generation programs ``prefill`` and ``decode``, kept while it lives. The
      same path, devices and mesh give the same handle while it is held.

    Raises:
      GenaiConfigError: the folder's genai_config.json and its model disagree (naming both).
      ModelLoadError: the file or its external data cannot be read safely.
      ValueError: devices and mesh disagree, or more devices than JAX has, or target with devices or mesh.
      TargetError: the target is not one libtpu knows, or libtpu is missing.

    Example:
      >>> model = onnx2jax.load("tests/data/genai/llama_gqa", devices=2)       # doctest: +SKIP
      >>> onnx2jax.generate(model, [1, 17, 230], max_new_tokens=8)          # doctest: +SKIP
    """
    if isinstance(model, Decoder):
        if devices or mesh is not None:
            raise ValueError("devices/mesh are fixed when the model is loaded: pass them to onnx2jax.load(...)")
        return model
    if target is not None:
        if devices or mesh is not None:
            raise ValueError("give target or devices/mesh, not both: the target's chips are the devices")
        resolved = parse_target(target)
        return _load(model, len(resolved.devices()), None, resolved)  # the plan lays its mesh over the chips
    size = _width(devices, mesh)
    key = _key(model, size, mesh)
    found = _LOADED.get(key) if key is not None else None
    if found is not None:
        return found
    decoder = _load(model, size, mesh)
    if key is not None:
        _LOADED[key] = decoder
    return decoder


def _width(devices: int | None, mesh: Mesh | None) -> int:
    """The tensor-parallel width ``devices`` / ``mesh`` ask for (1: one device)."""
    size = mesh.devices.size if mesh is not None else int(devices or 1)
    if devices and mesh is not None and devices != size:
        raise ValueError(f"devices={devices} but the mesh has {size} devices: give one of them")
    have = len(jax.devices())
    if mesh is None and size > have:
        raise DeviceCountError(None, size, have)  # names how to get them (fake CPU devices, ...)
    if size < 1:
        raise ValueError(f"devices must be 1 or more, got {devices}")
    return size


def _key(model: Any, size: int, mesh: Mesh | None) -> Hashable | None:
    """What a handle loaded from a path is remembered by (None: not a path, or a mesh that cannot be a key)."""
    if not isinstance(model, (str, os.PathLike)):
        return None
    try:
        hash(mesh)
    except TypeError:
        return None
    config = _genai.find_config(model)
    files = [os.path.realpath(_model_path(model))] + ([os.path.realpath(config)] if config is not None else [])
    stats = []
    for name in files:
        try:
            stat = os.stat(name)
        except OSError:  # loading says what is missing, by name
            return None
        stats.append((name, stat.st_ino, stat.st_size, stat.st_mtime_ns))
    return (tuple(stats), size, mesh)


def _model_path(model: str | os.PathLike) -> str:
    """The .onnx file a path names: genai_config.json's decoder, a folder's model.onnx, or the path itself."""
    config = _genai.find_config(model)
    if config is not None:
        return _genai.read_genai_config(config).model_path
    path = os.fspath(model)
    if os.path.isdir(path):
        candidate = os.path.join(path, "model.onnx")
        if not os.path.isfile(candidate):
            raise FileNotFoundError(f"{path}: no genai_config.json and no model.onnx in the folder")
        return candidate
    return path


def _load(model: ModelLike | JaxModel, size: int, mesh: Mesh | None, target: Target | None = None) -> Decoder:
    """Opens, plans, translates and compiles ``model`` once (the module docstring's steps)."""
    config = None
    if isinstance(model, (str, os.PathLike)):
        config_path = _genai.find_config(model)
        config = _genai.read_genai_config(config_path) if config_path else None
        proto, external_dir = open_model(config.model_path if config is not None else _model_path(model))
    else:
        source = Opened(model.proto, model._external_dir) if isinstance(model, JaxModel) else model
        proto, external_dir = open_model(source)
        if size > 1 or mesh is not None:  # the caller's model: the plan is written into a copy of it
            proto = copy.deepcopy(proto)
    owned = isinstance(model, (str, os.PathLike)) or size > 1 or mesh is not None  # rewritten in place
    graph = proto.graph
    if config is not None:
        _genai.check_against_model(config, graph)
        layout = kv_cache.from_genai_config(config, graph)
    else:
        initialized = {t.name for t in graph.initializer}
        path = os.fspath(_model_path(model)) if isinstance(model, (str, os.PathLike)) else None
        layout = kv_cache.from_graph(graph, [i.name for i in graph.input if i.name not in initialized], path)
    if layout.kind == "shared" and mask_width_conditions(graph, layout.attention_mask):
        if not owned:  # the caller's: copied
            proto, owned = copy.deepcopy(proto), True
            graph = proto.graph
        feed_total_length(graph, layout.attention_mask)  # LongRoPE's If on the real length (total_length)
    if owned and layout.logits is not None:
        # the LM head at the positions a step reads (logit_positions); a caller's model on one device is left
        # as given rather than copied with its weights
        gather_logit_positions(proto, layout.logits)
    inferred, configuration = None, None
    if size > 1 or mesh is not None:
        if size < 2:
            raise ValueError(f"tensor-parallel generation needs 2 or more devices, got {size}")
        name_nodes(proto)  # before shape inference: the plan names the nodes it annotates
        inferred = infer_model(proto)
        write_plan(proto, layout, size, inferred.shapes)
        configuration = CONFIGURATION
    # tensor-parallel: the program is planned at the first prefill's shapes (Decoder.plan_prefill), so that
    # the sharding inference before the first token runs once, at that prefill's shapes
    plan = make_plan(Opened(proto, external_dir), mesh, configuration=configuration, scan_layers=False,
                     inferred=inferred, program=configuration is None, target=target)
    if plan.kind != "whole":
        raise ValueError(f"generation runs a decoder as one program; this model's plan is of kind {plan.kind!r}")
    if isinstance(model, JaxModel) and plan.proto is model.proto and not model.scan.active:
        translated = model  # the caller's translation, of this very graph, layers unrolled: not translated again
    else:
        translated = JaxModel(plan.proto, plan.external_dir, scan_layers=False, inferred=plan.inferred)
    return Decoder(translated, plan, layout, size)


__all__ = ["load"]
