"""Where a decoder's KV cache is and how a generation loop drives it: :class:`CacheLayout`.

Three kinds, found from genai_config.json or from the graph's names:

- ``"shared"``: onnxruntime-genai's builder graphs (GroupQueryAttention reads every past). The past is a buffer
  of fixed capacity (``max_length`` positions), the attention mask as wide as the buffer says how many
  positions of each row hold tokens, and the op writes the new keys and values in place (onnxruntime's
  ``past_present_share_buffer``). Batches are RIGHT-padded, as onnxruntime-genai feeds these graphs.
  Sliding-window layers the builder gave a ring cache (GroupQueryAttention ``sliding_window_cache=1``,
  listed in genai_config's ``sliding_window.layers``) get a buffer of only ``window_size + cache_slack``
  positions (:meth:`CacheLayout.capacities`); the op keeps the window's most recent positions at its front
  and compacts it as the window moves (:mod:`onnx2jax.ops.contrib_attention`).
- ``"concat"``: torch / transformers exports (``past_key_values.N.key`` in, ``present.N.key`` out): the graph
  concatenates past and new, so its present is one position longer than its past. The loop keeps a buffer of
  ``max_length - 1`` positions, passes all of it as the past with the attention mask at 0 on the positions
  not yet written, and copies the present's last position into the buffer: one decode program for every
  length. Batches are LEFT-padded (mask 0 on the pads, positions counted from each row's first real token),
  as transformers feeds them.
- ``"none"``: no cache inputs: each step recomputes the whole sequence (quadratic in its length, one
  compile per length). Export with a cache instead: onnxruntime-genai's builder, or ``torch.onnx.export``
  of a model called with ``past_key_values``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

import numpy as np
import onnx

from onnx2jax.genai_config import CONFIG_NAME, GenaiConfig, GenaiConfigError

Kind = Literal["shared", "concat", "none"]

_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$|^past\.(\d+)\.(key|value)$")


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """A decoder's inputs, outputs and cache as the generation loop drives them.

    Attributes:
      kind: ``"shared"``, ``"concat"`` or ``"none"`` (module docstring).
      input_ids, attention_mask, position_ids, logits: the graph's names (None: the graph has none).
      past, present: the cache's inputs and the outputs that update them, pairwise (keys and values of
        every layer).
      kv_heads, head_size: of the cache ``[batch, kv_heads, positions, head_size]`` (None without a cache).
      dtype: the cache's element type.
      context_length: the longest sequence the model takes (None: not known).
      eos_token_ids, pad_token_id: from genai_config.json (empty / None without one).
      search: genai_config.json's search defaults ({} without one).
      source: where the layout was read from, for messages.
      vocab_size: the vocabulary (genai_config's, else the logits' last axis where the graph fixes it).
      ring: for each past entry, the positions of its ring cache (window + slack), or None for a cache of
        the whole sequence (() where no layer has a ring).
    """

    kind: Kind
    input_ids: str
    attention_mask: str | None
    position_ids: str | None
    logits: str
    past: tuple[str, ...] = ()
    present: tuple[str, ...] = ()
    kv_heads: int | None = None
    head_size: int | None = None
    dtype: Any = None
    context_length: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    search: dict = dataclasses.field(default_factory=dict)
    source: str = "the graph's input and output names"
    vocab_size: int | None = None
    ring: tuple[int | None, ...] = ()

    def capacities(self, capacity: int) -> tuple[int, ...]:
        """Each past entry's buffer positions for a run of ``capacity``: the ring's (at most ``capacity``)
        for the sliding-window layers that have one, ``capacity`` for the others."""
        rings = self.ring or (None,) * len(self.past)
        return tuple(capacity if r is None else min(r, capacity) for r in rings)

    def cache_shapes(self, batch: int, capacity: int) -> tuple[tuple[int, ...], ...]:
        """Each past entry's buffer ``[batch, kv_heads, positions, head_size]`` for a run of ``capacity``
        (:meth:`capacities`)."""
        return tuple((batch, self.kv_heads, c, self.head_size) for c in self.capacities(capacity))

    @property
    def padding(self) -> Literal["right", "left"]:
        """The side a batch of prompts of different lengths is padded on."""
        return "right" if self.kind == "shared" else "left"


def from_genai_config(config: GenaiConfig, graph: onnx.GraphProto) -> CacheLayout:
    """The layout a genai_config.json gives (checked against the graph beforehand)."""
    past = tuple(n for pair in zip(config.past_keys, config.past_values) for n in pair)
    present = tuple(n for pair in zip(config.present_keys, config.present_values) for n in pair)
    return CacheLayout(
        kind=_kind(graph, past),
        input_ids=config.inputs["input_ids"],
        attention_mask=config.inputs.get("attention_mask"),
        position_ids=config.inputs.get("position_ids"),
        logits=config.logits,
        past=past,
        present=present,
        kv_heads=config.kv_heads,
        head_size=config.head_size,
        dtype=_dtype(graph, past[0]),
        context_length=config.context_length,
        eos_token_ids=config.eos_token_ids,
        pad_token_id=config.pad_token_id,
        search=config.search,
        source=config.path,
        vocab_size=config.vocab_size or _vocab(graph, config.logits),
        ring=_rings(config, past),
    )


def _rings(config: GenaiConfig, past: tuple[str, ...]) -> tuple[int | None, ...]:
    """Each past entry's ring capacity (window + slack) where its layer has a ring cache, else None."""
    if not config.window_layers or not config.window_size:
        return ()
    ring = config.window_size + config.window_slack
    layer_of = {n: i for i, pair in enumerate(zip(config.past_keys, config.past_values)) for n in pair}
    return tuple(ring if layer_of[n] in config.window_layers else None for n in past)


def from_graph(graph: onnx.GraphProto, input_names: list[str], model_path: str | None = None) -> CacheLayout:
    """The layout read from the graph's names: ``past_key_values.N.key/value`` (or ``past.N.*``) inputs,
    ``present.N.key/value`` outputs, ``input_ids``, ``attention_mask``, ``position_ids``, ``logits``.

    Raises:
      ValueError: no ``input_ids`` input, or a past input without its present output (named).
      GenaiConfigError: a builder graph (GroupQueryAttention) whose cache leaves its KV heads or head size
        symbolic: they are in the genai_config.json the folder (of ``model_path``) lacks.
    """
    if "input_ids" not in input_names:
        raise ValueError(f"not a decoder: no 'input_ids' input (the inputs are {input_names})")
    outputs = [o.name for o in graph.output]
    logits = "logits" if "logits" in outputs else outputs[0]
    layers: dict[int, dict[str, str]] = {}
    for name in input_names:
        match = _PAST.match(name)
        if match:
            layer, part = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
            layers.setdefault(int(layer), {})[part] = name
    common = dict(
        input_ids="input_ids",
        attention_mask="attention_mask" if "attention_mask" in input_names else None,
        position_ids="position_ids" if "position_ids" in input_names else None,
        logits=logits,
    )
    if not layers:
        return CacheLayout(kind="none", **common)
    past, present = [], []
    for layer in sorted(layers):
        for part in ("key", "value"):
            name = layers[layer].get(part)
            out = f"present.{layer}.{part}"
            if name is None or out not in outputs:
                raise ValueError(
                    f"cache of layer {layer}: expected input past_key_values.{layer}.{part} and output {out}; "
                    f"the inputs are {input_names}, the outputs {outputs}"
                )
            past.append(name)
            present.append(out)
    dims = _shape(graph, past[0])
    kind = _kind(graph, tuple(past))
    if not (isinstance(dims[1], int) and isinstance(dims[3], int)):
        _missing_config(model_path, past[0], dims, kind)
    return CacheLayout(
        kind=kind,
        past=tuple(past),
        present=tuple(present),
        kv_heads=dims[1] if isinstance(dims[1], int) else None,
        head_size=dims[3] if isinstance(dims[3], int) else None,
        dtype=_dtype(graph, past[0]),
        vocab_size=_vocab(graph, logits),
        **common,
    )


def _missing_config(model_path: str | None, past: str, dims: list, kind: Kind) -> None:
    """Refuses a cache whose KV heads or head size the graph leaves symbolic, naming the missing config."""
    import os

    where = os.path.join(os.path.dirname(os.path.abspath(model_path)), CONFIG_NAME) if model_path else CONFIG_NAME
    builder = ""
    if kind == "shared":
        builder = " (a GroupQueryAttention graph: onnxruntime-genai's builder writes them there)"
    raise GenaiConfigError(
        f"{where} is missing: the cache input {past!r} has shape {dims}, its KV heads (axis 1) and head size "
        f"(axis 3) are not fixed by the graph, and generation takes them from genai_config.json{builder}"
    )


def _vocab(graph: onnx.GraphProto, logits: str) -> int | None:
    """The logits' last axis where the graph fixes it."""
    info = next((o for o in graph.output if o.name == logits), None)
    dims = info.type.tensor_type.shape.dim if info is not None else ()
    return dims[-1].dim_value if dims and dims[-1].HasField("dim_value") else None


def _kind(graph: onnx.GraphProto, past: tuple[str, ...]) -> Kind:
    """``"shared"`` where every past feeds a GroupQueryAttention (which writes in place), else ``"concat"``."""
    fed = {n for node in graph.node if node.op_type == "GroupQueryAttention" for n in node.input[3:5]}
    return "shared" if past and set(past) <= fed else "concat"


def _shape(graph: onnx.GraphProto, name: str) -> list[int | str | None]:
    info = next(i for i in graph.input if i.name == name)
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in info.type.tensor_type.shape.dim]


def _dtype(graph: onnx.GraphProto, name: str) -> np.dtype:
    info = next(i for i in graph.input if i.name == name)
    return onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
