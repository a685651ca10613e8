"""`sharding.tile_map` (what ``explain --plot`` draws) against JAX's own index maps.

For the demo model and zoo models with the Megatron plan on 8 fake CPU
devices, every drawn tensor's tiles (computed through `sharding.tiles`) must
equal what the compiled program holds: ``NamedSharding.devices_indices_map``
of the placement ``onnx2jax.compile`` chose for that tensor (jax's index
arithmetic, on the mesh found by `sharding.mesh.layout`; a fused axis is folded
back from its sub-axes with numpy). Collectives per layer are compared with
the inference's collective and reshard notes, one by one.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.cli.demo import default_model
from sharding.annotate import annotate_tensor
from sharding.check import check_and_infer
from sharding.megatron import megatron_plan
from sharding.text import parse_spec
from sharding.tile_map import AFTER, BEFORE, NO_METADATA, OUTSIDE, collective_of, node_layer, select, tile_map

ZOO = Path(__file__).resolve().parents[1] / "data" / "zoo"
MODELS = {
    "demo": (default_model(), {"input_ids": (2, 16)}),
    "gpt2": (ZOO / "gpt2.onnx", {"input_ids": (2, 16)}),
    "phi3": (ZOO / "phi3.onnx", {"input_ids": (2, 16)}),
    "vit": (ZOO / "vit.onnx", {"pixel_values": (2, 3, 32, 32)}),
}


@functools.lru_cache(maxsize=None)
def _case(name: str):
    path, shapes = MODELS[name]
    model = megatron_plan(onnx.load(path), 8)
    _, inference = check_and_infer(model, input_shapes=shapes)
    compiled = onnx2jax.compile(model)
    # The placements of one call with these input shapes (no XLA compilation needed).
    signature = compiled._signature(("tile_map", name), shapes)
    return model, inference, compiled, signature


def _placements_by_tensor(model, signature):
    """tensor -> placement: its producer's output spec; a weight's or input's first reader's."""
    sources = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    found = {}
    for key, placement in signature.placements.items():
        if key.kind == "out":
            found[key.tensor] = placement
        elif key.tensor in sources:
            found.setdefault(key.tensor, placement)
    return found


def _ranges(indices: np.ndarray) -> tuple[tuple[int, int], ...]:
    """Sorted global indices as maximal [start, stop) runs."""
    runs = []
    for i in np.sort(indices).tolist():
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    return tuple((a, b) for a, b in runs)


def _jax_ranges(placement, shape, mesh_devices) -> dict[int, tuple[tuple[tuple[int, int], ...], ...]]:
    """Per configuration device, per tensor axis, the global ranges JAX places there."""
    fused = dict(placement.fused)
    expanded = []
    for axis, size in enumerate(shape):
        expanded += list(fused.get(axis, (size,)))
    result = {}
    for device, slices in placement.sharding.devices_indices_map(tuple(expanded)).items():
        per_axis, k = [], 0
        for axis, size in enumerate(shape):
            subs = fused.get(axis, (size,))
            picked = [np.arange(s)[slices[k + j]] for j, s in enumerate(subs)]
            k += len(subs)
            flat = np.ravel_multi_index(np.ix_(*picked), subs).ravel() if subs else np.zeros(0, int)
            per_axis.append(_ranges(flat))
        result[mesh_devices.index(device)] = tuple(per_axis)
    return result


@pytest.mark.parametrize("name", list(MODELS))
def test_tiles_equal_jax_devices_indices_map(name):
    model, inference, compiled, signature = _case(name)
    tiles = tile_map(model, inference)
    placements = _placements_by_tensor(model, signature)
    mesh_devices = list(compiled.mesh.devices.flat)
    compared = split = fused = 0
    for tensor in tiles.tensors():
        placement = placements.get(tensor.name)
        if placement is None or not all(isinstance(d, int) for d in tensor.shape):
            continue
        reference = _jax_ranges(placement, tensor.shape, mesh_devices)
        assert sorted(reference) == [t.device for t in tensor.tiles]
        for tile in tensor.tiles:
            held = reference[tile.device]
            assert len(tile.pieces) == 1, (tensor.name, tile)
            assert tile.pieces[0] == tuple(held[a] for a in tensor.cut_axes), (tensor.name, tile.device)
            for axis, size in enumerate(tensor.shape):
                if axis not in tensor.cut_axes:
                    assert held[axis] == (((0, size),) if size else ()), (tensor.name, axis)
        compared += 1
        split += not tensor.replicated
        fused += bool(placement.fused)
    drawable = [t for t in tiles.tensors() if all(isinstance(d, int) for d in t.shape)]
    # Every drawable tensor the program places was compared, the split weights of every layer among them.
    assert compared >= 0.9 * len(drawable)
    assert split >= 2 * 4 + 1  # 2 blocks x (at least 4 split projections) + the embedding or head
    if name == "phi3":
        assert fused  # the fused gate/up projection: tiles of several disjoint ranges


@pytest.mark.parametrize("name", ["demo", "gpt2"])
def test_collectives_per_layer_are_the_inference_notes(name):
    model, inference, _, _ = _case(name)
    tiles = tile_map(model, inference)
    notes = [collective_of(d) for d in inference.diagnostics if d.code in ("collective", "reshard")]
    drawn = [c for layer in tiles.layers for c in layer.collectives]
    key = lambda c: (c.node, c.tensor, c.kind)  # noqa: E731
    assert sorted(drawn, key=key) == sorted(notes, key=key) and notes
    layer_of = {n.name: node_layer(n) for n in model.graph.node}
    for layer in tiles.layers:
        for c in layer.collectives:
            if layer.name in (BEFORE, AFTER) or layer.name.startswith("(after "):
                assert layer_of[c.node] in (OUTSIDE, None)
            else:
                assert layer_of[c.node] == layer.name
    # Megatron: one all-reduce per row-parallel projection, two per block (tests/onnx2jax/zoo_cases.py).
    blocks = [layer for layer in tiles.layers if layer.name.rsplit(".", 1)[-1].isdigit()]
    assert len(blocks) == 2
    assert [[c.kind for c in layer.collectives] for layer in blocks] == [["all-reduce"] * 2] * 2


def test_select_counts_everything_it_leaves_out():
    model, inference, _, _ = _case("demo")
    tiles = tile_map(model, inference)
    shown, left_out = select(tiles, max_rows=8, max_layers=3)
    assert [s.layer for s in shown] + left_out == list(tiles.layers)
    for s in shown:
        assert len(s.tensors) + s.more == len(s.layer.tensors)
        assert s.more_split == sum(not t.replicated for t in s.layer.tensors) - sum(not t.replicated for t in s.tensors)
        # split weights come first
        kinds = [(t.replicated, t.kind != "weight") for t in s.tensors]
        assert kinds == sorted(kinds)


def test_a_cut_symbolic_axis_is_listed_not_dropped():
    model, _, _, _ = _case("demo")
    # Without input shapes the batch and sequence axes are symbolic; the Megatron plan cuts none of them,
    # so cut the sequence axis of the input to see the tensor listed as unplaced.
    annotated = onnx.ModelProto()
    annotated.CopyFrom(model)
    annotate_tensor(annotated, "input_ids", parse_spec("1:8 @ [0,1,2,3,4,5,6,7]"))
    inference = check_and_infer(annotated)[1]
    tiles = tile_map(annotated, inference)
    unplaced = [u for layer in tiles.layers for u in layer.unplaced]
    assert "input_ids" in [u.name for u in unplaced]
    assert "input_ids" not in [t.name for t in tiles.tensors()]


def test_a_model_without_layer_metadata_is_one_group_with_every_tensor():
    model, inference, _, _ = _case("demo")
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for node in bare.graph.node:
        del node.metadata_props[:]
    tiles = tile_map(bare, inference)
    assert [layer.name for layer in tiles.layers] == [NO_METADATA]
    assert sorted(t.name for t in tiles.tensors()) == sorted(t.name for t in tile_map(model, inference).tensors())
    ((shown,), left_out) = select(tiles, max_rows=20)
    assert not left_out and len(shown.tensors) == 20 and shown.more == len(tiles.tensors()) - 20
