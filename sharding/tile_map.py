"""What ``onnx2jax explain --plot`` draws, as plain data: tiles per tensor and collectives per layer.

No drawing library here: `tile_map` turns an `Inference` into, per tensor
that carries a spec, which index ranges of which axis each device holds
(through `sharding.tiles.device_regions`), grouped by layer, and the
collectives the inference predicts, per layer. `select` decides which rows a
figure of bounded size shows and counts what it leaves out, so that a
renderer only draws (and says "+N more" instead of dropping anything).

Worked example: the demo's ``val_322`` (an MLP up-projection weight, shape
[64, 128], spec ``1:8 @ [0..7]``) has one cut axis, 1. Device d holds the
columns ``[16 d, 16 d + 16)`` of it and all 64 rows, so its tile is
``pieces=(((16 d, 16 d + 16),),)``: one region, one cut axis, one range.
A replicated tensor has no cut axis; every device's tile is ``((),)``:
one region holding the whole tensor.

Layers come from the node's ``namespace`` metadata, which torch's ONNX
exporter writes (``.../model.model.layers.0: LlamaDecoderLayer/...``): a
node's layer is the first module on that path whose name ends in a number.
Nodes outside any numbered module are grouped by where they sit:
``"(before the layers)"``, ``"(after the layers)"`` or ``"(after <layer>)"``
between two layers; a model without that metadata is one group,
``"(no layer metadata)"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic
from sharding.infer import Inference, reshard_note_kind
from sharding.rules.base import Shape
from sharding.rules.views import sharded_dims
from sharding.model_configs import device_configurations
from sharding.spec import ShardingSpec
from sharding.text import format_spec
from sharding.tiles import Range, device_regions

OUTSIDE = "(outside layers)"
BEFORE = "(before the layers)"
AFTER = "(after the layers)"
NO_METADATA = "(no layer metadata)"

Kind = Literal["weight", "input", "activation"]


@dataclass(frozen=True, slots=True)
class DeviceTile:
    """What one device holds of a tensor.

    Attributes:
        device: The configuration's device index.
        pieces: One entry per region the device holds (usually one, none when
            the spec leaves the device out); a region is, per cut axis of the
            tensor (`TensorTiles.cut_axes`, in that order), its global
            ``[start, stop)`` ranges (several for a fused axis). Uncut axes
            are held whole and not listed.
    """

    device: int
    pieces: tuple[tuple[tuple[Range, ...], ...], ...]


@dataclass(frozen=True, slots=True)
class TensorTiles:
    """One tensor's tiles over every device of the configuration.

    Attributes:
        name: The tensor.
        kind: ``"weight"`` (an initializer), ``"input"`` (a graph input) or
            ``"activation"``.
        layer: Its producer's layer (first consumer's for weights and inputs).
        shape: Its shape (ints, or symbols on uncut axes).
        spec: The spec in the text notation.
        cut_axes: The axes split into more than one block.
        tiles: One per device of the configuration, in device order.
    """

    name: str
    kind: Kind
    layer: str
    shape: tuple[int | str | None, ...]
    spec: str
    cut_axes: tuple[int, ...]
    tiles: tuple[DeviceTile, ...]

    @property
    def replicated(self) -> bool:
        """True when every device that holds the tensor holds all of it."""
        return not self.cut_axes

    def blocks(self) -> list[tuple[tuple[Range, ...], ...]]:
        """The distinct regions, sorted: a renderer's colour index for each."""
        return sorted({piece for tile in self.tiles for piece in tile.pieces})


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective the inference predicts.

    Attributes:
        kind: ``all-reduce``, ``all-gather``, ``all-to-all``, ... (reshards
            are named after XLA's collectives, see `sharding.reshard`).
        node: The node it happens at.
        tensor: The tensor it produces or moves.
    """

    kind: str
    node: str | None
    tensor: str | None


@dataclass(frozen=True, slots=True)
class Unplaced:
    """A tensor with a spec whose tiles cannot be drawn, and why."""

    name: str
    layer: str
    reason: str


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer's tensors and collectives, in graph order."""

    name: str
    tensors: tuple[TensorTiles, ...]
    collectives: tuple[Collective, ...]
    unplaced: tuple[Unplaced, ...] = ()


@dataclass(frozen=True, slots=True)
class TileMap:
    """Everything a figure of a model's placement shows.

    Attributes:
        configuration: The device configuration drawn.
        num_devices: Its number of devices.
        layers: In order of first appearance in the graph.
        collectives_source: Where the collectives come from, for the title.
    """

    configuration: str | None
    num_devices: int
    layers: tuple[Layer, ...]
    collectives_source: str = "predicted by sharding inference"

    def tensors(self) -> list[TensorTiles]:
        """Every drawable tensor, layer by layer."""
        return [t for layer in self.layers for t in layer.tensors]


def node_layer(node: onnx.NodeProto) -> str | None:
    """The numbered module a node belongs to, from torch's ``namespace`` metadata.

    Returns ``OUTSIDE`` for a node with metadata outside any numbered module and
    None when the node has no ``namespace`` entry.
    """
    namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), None)
    if namespace is None:
        return None
    for segment in namespace.split("/"):
        path = segment.split(":", 1)[0].strip()
        if path.rsplit(".", 1)[-1].isdigit():
            return path
    return OUTSIDE


def collective_of(diagnostic: Diagnostic) -> Collective | None:
    """The collective a ``collective`` or ``reshard`` note announces, or None for other diagnostics."""
    if diagnostic.code == codes.COLLECTIVE:
        kind = diagnostic.expected or "collective"
    elif diagnostic.code == codes.RESHARD:
        kind = reshard_note_kind(diagnostic)
    else:
        return None
    return Collective(kind, diagnostic.node, diagnostic.tensor)


def _layers(model: onnx.ModelProto) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(node key -> layer, tensor -> layer, layer order)."""
    found = [node_layer(n) for n in model.graph.node]
    if all(f is None for f in found):
        found = [NO_METADATA] * len(found)
    numbered = [f for f in found if f not in (None, OUTSIDE)]
    last = numbered[-1] if numbered else None
    by_node: dict[str, str] = {}
    by_tensor: dict[str, str] = {}
    order: list[str] = []
    seen: str | None = None
    for index, (node, layer) in enumerate(zip(model.graph.node, found, strict=True)):
        if layer in (None, OUTSIDE):
            # Name the run of nodes outside numbered modules by where it sits.
            layer = BEFORE if seen is None else AFTER if seen == last else f"(after {seen})"
        elif layer != NO_METADATA:
            seen = layer
        by_node[node.name or f"{node.op_type}#{index}"] = layer
        if layer not in order:
            order.append(layer)
        for name in node.input:
            by_tensor.setdefault(name, layer)  # inputs and weights: their first consumer's layer
        for name in node.output:
            by_tensor[name] = layer
    return by_node, by_tensor, order


def _tensor_tiles(
    name: str, kind: Kind, layer: str, spec: ShardingSpec, shape: Shape | None, num_devices: int
) -> TensorTiles | Unplaced:
    if shape is None:
        return Unplaced(name, layer, "shape unknown")
    cut = {axis for axis, _ in sharded_dims(spec, len(shape))}
    symbolic = [axis for axis in sorted(cut) if not isinstance(shape[axis], int)]
    if symbolic:
        return Unplaced(name, layer, f"axis {symbolic[0]} is cut but its size {shape[symbolic[0]]!r} is unknown")
    # An uncut symbolic axis is held whole by every device: one block of size 1 stands for it.
    concrete = [d if isinstance(d, int) else 1 for d in shape]
    try:
        regions = device_regions(spec, concrete)
    except ValueError as e:
        return Unplaced(name, layer, str(e))
    split = tuple(
        axis for axis in range(len(concrete))
        if any(r.ranges[axis] != ((0, concrete[axis]),) for rs in regions.values() for r in rs)
    )
    tiles = tuple(
        DeviceTile(device, tuple(tuple(r.ranges[a] for a in split) for r in regions.get(device, ())))
        for device in range(num_devices)
    )
    return TensorTiles(name, kind, layer, tuple(shape), format_spec(spec), split, tiles)


def tile_map(model: onnx.ModelProto, inference: Inference) -> TileMap:
    """Per layer, every tensor with a spec and where its tiles are, and the predicted collectives.

    Args:
        model: The model `inference` was run on.
        inference: `sharding.infer`'s result (with concrete input shapes
            where a cut axis is symbolic: such tensors are listed as
            `Unplaced`, never dropped).

    Returns:
        The `TileMap`.

    Raises:
        ValueError: The model has no device configuration.
    """
    configs = device_configurations(model)
    if inference.configuration is None or inference.configuration not in configs:
        raise ValueError("the model has no device configuration: there are no tiles to draw")
    num_devices = configs[inference.configuration].num_devices
    by_node, by_tensor, order = _layers(model)
    weights = {t.name for t in model.graph.initializer}
    inputs = {i.name for i in model.graph.input} - weights
    tensors: dict[str, list] = {layer: [] for layer in order}
    for name, spec in inference.tensors.items():
        kind: Kind = "weight" if name in weights else "input" if name in inputs else "activation"
        layer = by_tensor.get(name, AFTER)
        tensors.setdefault(layer, []).append(
            _tensor_tiles(name, kind, layer, spec, inference.shapes.get(name), num_devices)
        )
    collectives: dict[str, list[Collective]] = {}
    for d in inference.diagnostics:
        found = collective_of(d)
        if found is not None:
            collectives.setdefault(by_node.get(d.node or "", AFTER), []).append(found)
    layers = []
    for layer in [*order, *(k for k in tensors if k not in order)]:
        items, moved = tensors.get(layer, []), collectives.get(layer, [])
        if not items and not moved:
            continue
        layers.append(Layer(
            layer,
            tuple(t for t in items if isinstance(t, TensorTiles)),
            tuple(moved),
            tuple(t for t in items if isinstance(t, Unplaced)),
        ))
    return TileMap(inference.configuration, num_devices, tuple(layers))


@dataclass(frozen=True, slots=True)
class Shown:
    """One layer's rows in a figure of bounded size.

    Attributes:
        layer: The layer.
        tensors: The tensors drawn: split ones first, then replicated, each
            group in graph order.
        more_split: How many split tensors of the layer are not drawn.
        more_replicated: How many replicated tensors of the layer are not drawn.
    """

    layer: Layer
    tensors: tuple[TensorTiles, ...]
    more_split: int
    more_replicated: int

    @property
    def more(self) -> int:
        """Tensors of the layer not drawn (not counting the unplaced ones)."""
        return self.more_split + self.more_replicated


def select(tiles: TileMap, *, max_rows: int = 60, max_layers: int = 12) -> tuple[list[Shown], list[Layer]]:
    """Which rows a figure shows: about ``max_rows`` tensors over at most ``max_layers`` layers.

    Each layer shown gets an equal share of ``max_rows`` (at least 4 rows).
    Split weights come first, then other split tensors, then replicated ones
    (what a reader looks for first), each in graph order. Every tensor left
    out is counted in `Shown.more_split` / `Shown.more_replicated`, and every
    layer left out is returned.

    Returns:
        (layers shown, layers left out).
    """
    if max_rows < 1 or max_layers < 1:
        raise ValueError(f"max_rows and max_layers must be >= 1, got {max_rows} and {max_layers}")
    kept = tiles.layers[:max_layers]
    per_layer = max(4, max_rows // max(1, len(kept)))
    shown = []
    for layer in kept:
        ranked = sorted(layer.tensors, key=lambda t: (t.replicated, t.kind != "weight"))  # stable: graph order
        drawn = ranked[:per_layer]
        split = sum(not t.replicated for t in layer.tensors)
        shown.append(Shown(
            layer, tuple(drawn),
            split - sum(not t.replicated for t in drawn),
            len(layer.tensors) - split - sum(t.replicated for t in drawn),
        ))
    return shown, list(tiles.layers[max_layers:])


def collective_counts(layer: Layer) -> dict[str, int]:
    """The layer's collectives counted by kind, kinds sorted."""
    counts: dict[str, int] = {}
    for c in layer.collectives:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    return dict(sorted(counts.items()))


def describe(tensor: TensorTiles, piece: tuple[tuple[Range, ...], ...]) -> str:
    """A short label for one region, e.g. ``"16:32"`` or ``"0:4, 8:16"`` (axes joined by ``|``)."""
    if not tensor.cut_axes:
        return "all"
    return "|".join(",".join(f"{a}:{b}" for a, b in ranges) or "-" for ranges in piece)

