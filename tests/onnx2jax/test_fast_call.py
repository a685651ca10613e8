"""A compiled model's repeated call (onnx2jax.runtime.fast_call) gives what the full path gives.

The tiny Llama with the Megatron plan on 8 fake devices: its logits are
checked against onnxruntime's stored outputs and against the full path's
(same values bit for bit, same sharding) for every kind of input a call can
take: numpy, a jax.Array on one device, one already sharded on the mesh, one
on a mesh with Explicit axes.
"""

import pathlib

import jax
import numpy as np
import onnx
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

import onnx2jax
from sharding.megatron import megatron_plan

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="module")
def llama():
    compiled = onnx2jax.compile(megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8))
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    reference = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]
    return compiled, ids, reference


def _full_path(compiled, *inputs):
    """The full path of a call (bind, infer, place, trace under the model's mesh), never the short one."""
    with compiled._scope():
        jitted, args, _ = compiled._program(inputs, {})
        return jitted(*args)


def _without_full_path(compiled, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the call took the full path")

    monkeypatch.setattr(compiled, "_program", refuse)


def test_repeated_calls_skip_the_full_path_and_give_its_values_and_sharding(llama, monkeypatch):
    compiled, ids, reference = llama
    (first,) = compiled(ids)
    (full,) = _full_path(compiled, ids)
    compiled(input_ids=ids)
    _without_full_path(compiled, monkeypatch)
    for _ in range(3):
        (again,) = compiled(ids)
        assert again.sharding == full.sharding == first.sharding
        np.testing.assert_array_equal(np.asarray(again), np.asarray(full))
    np.testing.assert_allclose(np.asarray(again), reference, rtol=1e-4, atol=1e-4)
    assert compiled(input_ids=ids)[0].sharding == full.sharding  # a named call has its own short path


def _one_device(compiled, ids):
    with jax.enable_x64(True):
        return jax.device_put(ids, jax.devices()[3])


def _on_mesh(compiled, ids):
    with jax.enable_x64(True):
        return jax.device_put(ids, NamedSharding(compiled.mesh, PartitionSpec()))


def _explicit(compiled, ids):
    mesh = Mesh(compiled.mesh.devices, compiled.mesh.axis_names, axis_types=(AxisType.Explicit,))
    with jax.enable_x64(True):
        return jax.device_put(ids, NamedSharding(mesh, PartitionSpec()))


@pytest.mark.parametrize("make", [_one_device, _on_mesh, _explicit], ids=["one-device", "on-mesh", "explicit-axes"])
def test_jax_array_inputs_take_the_short_path_placed_as_the_full_path_placed_them(llama, make, monkeypatch):
    compiled, ids, reference = llama
    value = make(compiled, ids)
    (first,) = compiled(value)
    (full,) = _full_path(compiled, value)
    _without_full_path(compiled, monkeypatch)
    (again,) = compiled(value)
    assert again.sharding == full.sharding
    np.testing.assert_array_equal(np.asarray(again), np.asarray(full))
    np.testing.assert_array_equal(np.asarray(first), np.asarray(full))
    np.testing.assert_allclose(np.asarray(again), reference, rtol=1e-4, atol=1e-4)
    assert value.sharding == make(compiled, ids).sharding  # the caller's array is left where it was


def test_a_new_dtype_or_shape_goes_through_the_full_path_and_its_checks(llama):
    compiled, ids, reference = llama
    compiled(ids)
    with pytest.raises(TypeError, match="input 'input_ids': expected dtype int64, got int32"):
        compiled(ids.astype(np.int32))
    (shorter,) = compiled(ids[:, :8])
    # Causal attention: the first 8 positions' logits do not depend on the tokens after them.
    np.testing.assert_allclose(np.asarray(shorter), reference[:, :8], rtol=1e-4, atol=1e-4)
