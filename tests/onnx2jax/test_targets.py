"""Compiling for a TPU topology that is not attached (onnx2jax.runtime.targets, issue 41 items 1 and 2).

References: the same model compiled for the 8 fake CPU devices (the TPU program's collectives, counted
from the compiled HLO, equal the CPU program's), the analytic per-device parameter bytes of a Megatron
plan (a hand count), and the refusals named by class and target. libtpu's compile-only devices come from
``jax.experimental.topologies``; nothing here touches a TPU.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.errors import NoDevicesError, TargetError
from onnx2jax.runtime import targets
from onnx2jax.runtime.report import count_collectives
from sharding.megatron import megatron_plan

pytestmark = pytest.mark.skipif(not targets.libtpu_available(), reason="libtpu (the test extra) is not installed")

IDS = np.arange(16, dtype=np.int64).reshape(1, 16) % 50


@functools.lru_cache(maxsize=None)
def _llama(tp: int):
    return megatron_plan(onnx.load(onnx2jax.demo_model_path()), tp)


@functools.lru_cache(maxsize=None)
def _cpu_collectives(tp: int, scan: bool = False) -> dict[str, int]:
    """The reference: the same plan's program compiled for the 8 fake CPU devices."""
    return count_collectives(onnx2jax.compile(_llama(tp), scan_layers=scan).compiled_text(IDS))


@functools.lru_cache(maxsize=None)
def _v5e():
    return onnx2jax.compile(_llama(8), target="tpu:v5e:2x4")


@pytest.mark.parametrize("tp", [8, 4])
def test_tiny_llama_compiles_for_v5e_with_the_cpu_programs_collectives(tp):
    model = _llama(tp)
    if tp == 8:
        tpu = _v5e()
    else:  # a plan for 4 devices on a 4-chip target, and a Mesh of topology devices given as mesh=
        from jax.sharding import Mesh

        devices = targets.parse_target("v5e:2x2").devices()
        tpu = onnx2jax.compile(model, mesh=Mesh(np.array(devices), ("x",)))
    assert {d.platform for d in tpu.mesh.devices.flat} == {"tpu"}
    assert tpu.target == ("tpu:v5e:2x4" if tp == 8 else "tpu TPU v5 lite x4")  # what NoDevicesError names
    compiled = tpu.lower(IDS.shape).compile()
    assert count_collectives(compiled.as_text()) == _cpu_collectives(tp)
    assert _cpu_collectives(tp)["all-reduce"] > 0  # the comparison counts something


def test_a_target_executable_lowers_with_abstract_inputs_and_reports_without_placing():
    tpu = _v5e()
    import jax

    by_shape = tpu.lower(IDS.shape).as_text()
    by_struct = tpu.lower(jax.ShapeDtypeStruct(IDS.shape, np.int64)).as_text()
    by_array = tpu.lower(IDS).as_text()
    assert by_shape == by_struct == by_array
    report = tpu.report(IDS.shape)
    assert not tpu._placed  # nothing was placed
    # Hand count: every parameter's bytes, each split 8 ways where its spec splits it, else whole.
    cpu = onnx2jax.compile(_llama(8))
    expected = {}
    for array in cpu.stored_params.values():
        for shard in array.addressable_shards:
            expected[shard.device.id] = expected.get(shard.device.id, 0) + shard.data.nbytes
    assert sorted(report.param_bytes_per_device.values()) == sorted(expected.values())
    assert report.collectives == _cpu_collectives(8)


def test_running_or_placing_for_a_target_is_refused_by_name():
    tpu = _v5e()
    with pytest.raises(NoDevicesError, match="tpu:v5e:2x4"):
        tpu(IDS)
    with pytest.raises(NoDevicesError, match="tpu:v5e:2x4.*not attached"):
        tpu.params


@pytest.mark.parametrize("name", ["mistral", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_zoo_models_compile_for_v5e_with_the_cpu_programs_collectives(name):
    model = megatron_plan(onnx.load(ZOO / f"{name}.onnx"), CASES[name].tp)
    inputs = dict(np.load(ZOO / f"{name}.inputs.npz"))
    tpu = onnx2jax.compile(model, target="tpu:v5e:2x4")
    text = tpu.lower(**inputs).compile().as_text()
    assert count_collectives(text) == count_collectives(onnx2jax.compile(model).compiled_text(**inputs))


def test_target_names_are_parsed_as_jax_spells_topologies():
    assert targets.parse_target("tpu:v5e:2x4") == targets.Target("tpu", "v5e:2x4")
    assert targets.parse_target("v5p:2x2x2", slices=2) == targets.Target("tpu", "v5p:2x2x2", 2)
    for bad in ("v5e", "tpu:v5e:2xq", "gpu:a100", "v5e:2x4:1"):
        with pytest.raises(TargetError, match="as jax spells it"):
            targets.parse_target(bad)
    assert "tpu:v5e:2x4" in targets.list_targets()


def test_a_plan_for_another_device_count_than_the_targets_is_refused():
    with pytest.raises(TargetError, match="8 devices, the target 4"):
        onnx2jax.compile(_llama(8), target="tpu:v5e:2x2")


def test_missing_libtpu_says_what_to_install(monkeypatch):
    monkeypatch.setattr(targets, "libtpu_available", lambda: False)
    targets._topology.cache_clear()
    try:
        with pytest.raises(TargetError, match=r"pip install 'jax\[tpu\]'"):
            onnx2jax.compile(_llama(8), target="tpu:v5e:2x4")
    finally:
        targets._topology.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["tpu:v5p:2x2x2", "tpu:v6e:2x4"])
def test_tiny_llama_compiles_for_other_generations(target):
    model = _llama(8)
    tpu = onnx2jax.compile(model, target=target)
    text = tpu.lower(IDS.shape).compile().as_text()
    assert count_collectives(text) == _cpu_collectives(8)


@pytest.mark.parametrize("damage", ["truncated", pytest.param("deleted", marks=pytest.mark.slow)])
def test_a_target_compile_never_opens_the_external_weights(tmp_path, damage):
    model = _llama(8)
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # onnx.save with external data rewrites the proto it is given
    onnx.save(saved, tmp_path / "m.onnx", save_as_external_data=True, location="w.bin")
    weights = tmp_path / "w.bin"
    assert weights.stat().st_size > 100_000  # the weights really are external
    if damage == "truncated":
        with open(weights, "r+b") as f:
            f.truncate(100)
    else:
        weights.unlink()
    tpu = onnx2jax.compile(str(tmp_path / "m.onnx"), target="tpu:v5e:2x4", scan_layers=True)
    assert tpu.model.scan.active  # the layers found from structure, stacked abstractly
    text = tpu.lower(IDS.shape).compile().as_text()
    assert count_collectives(text) == _cpu_collectives(8, True)
    # The same model on CPU devices does read its weights, and says the file is damaged.
    with pytest.raises(onnx2jax.errors.ModelLoadError, match="w.bin"):
        onnx2jax.compile(str(tmp_path / "m.onnx"))


def test_two_slices_put_the_data_axis_across_slices():
    from sharding.auto import auto_plan

    annotated, _ = auto_plan(onnx.load(onnx2jax.demo_model_path()), {"data": 2, "tensor": 4}, batch=4, seq=16,
                             memory_per_device=10**9)
    tpu = onnx2jax.compile(annotated, configuration="auto", target="tpu:v5e:2x2", slices=2)
    assert tpu.mesh.devices.size == 8
    slices = np.vectorize(lambda d: d.slice_index)(tpu.mesh.devices)
    # The first axis (the data axis, 2 ways) is the slice index; every other axis stays inside a slice.
    assert np.array_equal(slices, np.broadcast_to(np.arange(2).reshape(2, *[1] * (slices.ndim - 1)), slices.shape))
    ids = np.zeros((4, 16), np.int64)
    text = tpu.lower(ids.shape).compile().as_text()
    cpu = onnx2jax.compile(annotated, configuration="auto")
    assert count_collectives(text) == count_collectives(cpu.compiled_text(ids))


def test_placing_on_cpu_is_lazy_once_and_shared_with_copies():
    cpu = onnx2jax.compile(_llama(8))
    assert not cpu._placed  # planned, not placed
    trained = cpu.with_trainable(list(cpu.params)[:1])  # the first read places...
    assert trained.params is cpu.params  # ...once, for the copy too
    reference = {i.name: onnx.numpy_helper.to_array(i) for i in _llama(8).graph.initializer}
    for name in ("model.model.embed_tokens.weight",):
        np.testing.assert_array_equal(np.asarray(cpu.logical_params[name]), reference[name])
