"""Reading onnxruntime-genai's ``genai_config.json`` (the model builder's folders), checked against the model.

The config names the decoder's inputs and outputs (``past_key_values.%d.key`` ...), its heads, KV heads, head
size and layers, the context length, the eos/pad/bos ids and the search defaults (``max_length``,
``do_sample``, ``top_k``, ``top_p``, ``temperature``). :func:`read_genai_config` reads it;
:func:`check_against_model` refuses a folder whose config and model disagree, naming both sides. jax-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import onnx

from onnx2jax.errors import ModelLoadError

CONFIG_NAME = "genai_config.json"


class GenaiConfigError(ModelLoadError):
    """A genai_config.json that cannot be read, or that disagrees with its model."""


@dataclasses.dataclass(frozen=True)
class GenaiConfig:
    """What generation needs from a genai_config.json.

    Attributes:
      path: the config file.
      model_path: the decoder's .onnx file (``model.decoder.filename`` in the config's folder).
      inputs: role -> graph input name (``input_ids``, ``attention_mask``, ``position_ids`` where given).
      past_keys, past_values, present_keys, present_values: the cache's names, one per layer.
      logits: the logits output's name.
      heads, kv_heads, head_size, layers, hidden_size, vocab_size, context_length: the config's numbers.
      eos_token_ids: every eos id (the config may give a list).
      pad_token_id, bos_token_id: as given (None where absent).
      search: the ``search`` section as written (defaults of a run).
      window_layers: the layers whose cache is a window-sized ring (``model.decoder.sliding_window.layers``:
        the builder's ``sliding_window_cache=1`` layers); empty where there is none.
      window_size, window_slack: that block's ``window_size`` and ``cache_slack`` (positions the ring keeps
        beyond the window, so that it compacts every ``slack + 1`` steps rather than every step); None / 0.
    """

    path: str
    model_path: str
    inputs: dict[str, str]
    past_keys: tuple[str, ...]
    past_values: tuple[str, ...]
    present_keys: tuple[str, ...]
    present_values: tuple[str, ...]
    logits: str
    heads: int
    kv_heads: int
    head_size: int
    layers: int
    hidden_size: int | None
    vocab_size: int | None
    context_length: int | None
    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    bos_token_id: int | None
    search: dict[str, Any]
    window_layers: tuple[int, ...] = ()
    window_size: int | None = None
    window_slack: int = 0


def find_config(path: str | os.PathLike) -> str | None:
    """The genai_config.json of a folder, or beside a .onnx file; None where there is none."""
    folder = os.fspath(path) if os.path.isdir(path) else os.path.dirname(os.fspath(path))
    candidate = os.path.join(folder, CONFIG_NAME)
    return candidate if os.path.isfile(candidate) else None


def read_genai_config(path: str | os.PathLike) -> GenaiConfig:
    """Reads a genai_config.json (``path`` is the file or its folder).

    Raises:
      GenaiConfigError: the file is missing, is not JSON, or lacks a field generation needs (named).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, CONFIG_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise GenaiConfigError(f"{path}: cannot read it: {e}") from e
    model = raw.get("model", {})
    decoder = model.get("decoder", {})

    def need(section: dict, key: str, where: str) -> Any:
        if key not in section:
            raise GenaiConfigError(f"{path}: {where}.{key} is missing")
        return section[key]

    layers = int(need(decoder, "num_hidden_layers", "model.decoder"))
    ins, outs = need(decoder, "inputs", "model.decoder"), need(decoder, "outputs", "model.decoder")
    inputs = {role: ins[role] for role in ("input_ids", "attention_mask", "position_ids") if role in ins}
    if "input_ids" not in inputs:
        raise GenaiConfigError(f"{path}: model.decoder.inputs.input_ids is missing")
    eos = model.get("eos_token_id", ())
    window = decoder.get("sliding_window") or {}
    return GenaiConfig(
        path=path,
        model_path=os.path.join(os.path.dirname(path), need(decoder, "filename", "model.decoder")),
        inputs=inputs,
        past_keys=_per_layer(need(ins, "past_key_names", "model.decoder.inputs"), layers),
        past_values=_per_layer(need(ins, "past_value_names", "model.decoder.inputs"), layers),
        present_keys=_per_layer(need(outs, "present_key_names", "model.decoder.outputs"), layers),
        present_values=_per_layer(need(outs, "present_value_names", "model.decoder.outputs"), layers),
        logits=outs.get("logits", "logits"),
        heads=int(need(decoder, "num_attention_heads", "model.decoder")),
        kv_heads=int(need(decoder, "num_key_value_heads", "model.decoder")),
        head_size=int(need(decoder, "head_size", "model.decoder")),
        layers=layers,
        hidden_size=decoder.get("hidden_size"),
        vocab_size=model.get("vocab_size"),
        context_length=model.get("context_length"),
        eos_token_ids=tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])),
        pad_token_id=model.get("pad_token_id"),
        bos_token_id=model.get("bos_token_id"),
        search=dict(raw.get("search", {})),
        window_layers=tuple(int(i) for i in window.get("layers", ())),
        window_size=int(window["window_size"]) if window.get("window_size") else None,
        window_slack=int(window.get("cache_slack", 0) or 0),
    )


def _per_layer(pattern: str, layers: int) -> tuple[str, ...]:
    return tuple(pattern % i for i in range(layers)) if "%d" in pattern else (pattern,) * layers


def check_against_model(config: GenaiConfig, graph: onnx.GraphProto) -> None:
    """Raises GenaiConfigError where the config and the model's graph disagree, naming both sides.

    Checked: every input and output the config names exists; the number of layers (cache inputs); the KV
    heads and head size of each cache input where the graph fixes them; the heads of each
    GroupQueryAttention node; the vocabulary (the logits' last axis) where fixed.
    """
    model = os.path.basename(config.model_path)
    where = f"{os.path.basename(config.path)} and {model} disagree"
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    cache_inputs = [n for n in inputs if n.startswith("past")]
    if len(cache_inputs) != 2 * config.layers:
        raise GenaiConfigError(
            f"{where}: num_hidden_layers is {config.layers} ({2 * config.layers} cache inputs) in the config, "
            f"the model has {len(cache_inputs)} cache inputs"
        )
    for name in [*config.inputs.values(), *config.past_keys, *config.past_values]:
        if name not in inputs:
            raise GenaiConfigError(f"{where}: the config names input {name!r}, the model's inputs are {list(inputs)}")
    for name in [config.logits, *config.present_keys, *config.present_values]:
        if name not in outputs:
            raise GenaiConfigError(
                f"{where}: the config names output {name!r}, the model's outputs are {list(outputs)}"
            )
    for name in [*config.past_keys, *config.past_values]:
        dims = _dims(inputs[name])
        for axis, field, want in ((1, "num_key_value_heads", config.kv_heads), (3, "head_size", config.head_size)):
            if len(dims) == 4 and isinstance(dims[axis], int) and dims[axis] != want:
                raise GenaiConfigError(
                    f"{where}: {field} is {want} in the config, {model}'s input {name!r} has {dims[axis]} "
                    f"on axis {axis} (shape {dims})"
                )
    for node in graph.node:
        if node.op_type != "GroupQueryAttention":
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for attr, field, want in (("num_heads", "num_attention_heads", config.heads),
                                  ("kv_num_heads", "num_key_value_heads", config.kv_heads)):
            if attrs.get(attr) != want:
                raise GenaiConfigError(
                    f"{where}: {field} is {want} in the config, {model}'s GroupQueryAttention node "
                    f"{node.name!r} has {attr}={attrs.get(attr)}"
                )
    vocab = _dims(outputs[config.logits])[-1:] if config.vocab_size else []
    if vocab and isinstance(vocab[0], int) and vocab[0] != config.vocab_size:
        raise GenaiConfigError(
            f"{where}: vocab_size is {config.vocab_size} in the config, {model}'s {config.logits!r} has {vocab[0]}"
        )


def _dims(info: onnx.ValueInfoProto) -> list[int | str | None]:
    shape = info.type.tensor_type.shape
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in shape.dim]
