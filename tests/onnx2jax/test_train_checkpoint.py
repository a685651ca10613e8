"""Orbax checkpoints of sharded parameters and optimizer state, restored onto another mesh (issue 22).

A TP 8 state (parameters and Adam's moments, seeded random values at their shardings), saved,
restored onto TP 2 and onto one device: every restored array has its target's
sharding, and each device's shard equals the saved array at that shard's
index (numpy on the saved values, device by device). The same for an NNX
module's ``nnx.Param`` state.
"""

from __future__ import annotations

import jax
import numpy as np
import onnx
import optax
import pytest
from flax import nnx
from zoo_cases import ZOO

import onnx2jax
from onnx2jax import checkpoint
from onnx2jax.nnx import from_onnx
from sharding.megatron import megatron_plan

LLAMA = ZOO.parent / "tiny_llama.onnx"


def _compiled(tp: int):
    model = onnx.load(LLAMA)
    return onnx2jax.compile(megatron_plan(model, tp) if tp > 1 else model, scan_layers=False)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A TP 8 state to save: every parameter and Adam moment a seeded random array placed at its parameter's
    sharding (what the restore checks is that each value comes back where the target wants it, whatever made
    it: random values in place of two training steps spare the compile of the sharded train step, ~2/3 of the
    module's CPU time, and are never zeros, so a restore that fills zeros fails)."""
    tp8 = _compiled(8)
    names = tp8.trainable
    rng = np.random.default_rng(2)

    def placed(like: jax.Array) -> jax.Array:
        return jax.device_put(rng.normal(size=like.shape).astype(like.dtype), like.sharding)

    trained = {k: placed(tp8.params[k]) for k in names}
    (adam, *rest) = optax.adam(1e-2).init(trained)
    moments = {"mu": {k: placed(v) for k, v in trained.items()}, "nu": {k: placed(v) for k, v in trained.items()}}
    state = (adam._replace(count=adam.count + 2, **moments), *rest)
    path = tmp_path_factory.mktemp("ckpt") / "step_2"
    checkpoint.save(path, {"params": trained, "opt": state})
    host = jax.tree.map(np.asarray, {"params": trained, "opt": state})
    return path, host, names


@pytest.mark.parametrize("tp", [2, 1])
def test_restore_onto_another_mesh_equals_the_saved_state_device_by_device(saved, tp) -> None:
    path, host, names = saved
    target = _compiled(tp)
    params = {k: target.params[k] for k in names}
    like = {"params": params, "opt": optax.adam(1e-2).init(params)}
    restored = checkpoint.restore(path, like)
    leaves, expected, targets = jax.tree.leaves(restored), jax.tree.leaves(host), jax.tree.leaves(like)
    assert len(leaves) == len(expected) == len(targets) > 2 * len(names)
    for leaf, value, placed in zip(leaves, expected, targets):
        assert leaf.sharding.is_equivalent_to(placed.sharding, leaf.ndim)
        assert {s.device for s in leaf.addressable_shards} == {s.device for s in placed.addressable_shards}
        for shard in leaf.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), value[shard.index])
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(restored["opt"])) == (tp > 1)


def test_a_checkpoint_is_never_overwritten(saved) -> None:
    path, host, _ = saved
    with pytest.raises(ValueError, match="exists"):
        checkpoint.save(path, host)


def test_an_nnx_module_state_moves_from_tp8_to_tp2(tmp_path) -> None:
    source = from_onnx(megatron_plan(onnx.load(LLAMA), 8), scan_layers=False)
    target = from_onnx(megatron_plan(onnx.load(LLAMA), 2), scan_layers=False)
    for variable in nnx.state(source, nnx.Param)["params"].values():  # moved away from the ONNX weights both hold
        variable[...] = variable[...] * 1.5 + 0.25
    checkpoint.save(tmp_path / "module", nnx.state(source, nnx.Param))
    nnx.update(target, checkpoint.restore(tmp_path / "module", nnx.state(target, nnx.Param)))
    expected, placed = source.values(), target.compiled.params
    for name in target.compiled.trainable:
        value = target.values()[name]
        assert value.sharding.is_equivalent_to(placed[name].sharding, value.ndim), name
        for shard in value.addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(expected[name])[shard.index])
