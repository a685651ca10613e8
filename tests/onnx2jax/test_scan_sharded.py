"""Scanned layers in a sharded program (onnx2jax.runtime.scan_sharded): the zoo's Megatron plan on 8 fake devices.

References: onnxruntime's stored outputs and the unrolled sharded program: the same values, the same
collectives once the while loop's body is counted per iteration (exact counts from the compiled HLO),
the same parameter bytes on every device.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import onnx
import pytest
from jax.sharding import PartitionSpec
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives, param_bytes_per_device
from onnx2jax.errors import NodeError
from onnx2jax.runtime.scan_sharded import layer_specs_differ, loop_collectives
from sharding.megatron import megatron_plan

@functools.lru_cache(maxsize=None)
def _compiled(name: str, scan: bool):
    model = megatron_plan(onnx.load(ZOO / f"{name}.onnx"), CASES[name].tp)
    inputs = dict(np.load(ZOO / f"{name}.inputs.npz"))
    compiled = onnx2jax.compile(model, scan_layers=scan)
    return compiled, compiled(**inputs), compiled.compiled_text(**inputs)


@pytest.mark.parametrize("name", ["mistral", pytest.param("qwen2", marks=pytest.mark.slow)])
def test_scanned_megatron_program_has_the_unrolled_collectives_per_layer(name):
    unrolled, unrolled_out, unrolled_hlo = _compiled(name, False)
    scanned, scanned_out, scanned_hlo = _compiled(name, True)
    assert scanned.model.scan.active and "run as one lax.scan" in scanned.model.layers_report()
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    for output, a, b in zip(scanned.model.output_names, scanned_out, unrolled_out):
        np.testing.assert_allclose(np.asarray(a), reference[output], atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6, rtol=1e-5)
    outside, inside, trip = loop_collectives(scanned_hlo, count_collectives)
    total = count_collectives(unrolled_hlo)
    assert trip == scanned.model.scan.repetition.count == 2
    assert inside["all-reduce"] == 2  # one layer: attention output and MLP down projections
    assert {k: outside[k] + trip * inside[k] for k in total} == total
    # Stacked parameters keep the first layer's spec behind an unsplit layer axis, and every device
    # holds exactly the bytes it held unrolled.
    for first in scanned.model.scan.repetition.stacked:
        stacked = scanned.params[f"scan/{first}"]
        assert stacked.sharding.spec == PartitionSpec(None, *unrolled.params[first].sharding.spec)
    assert param_bytes_per_device(scanned.stored_params) == param_bytes_per_device(unrolled.stored_params)


def test_layers_whose_specs_differ_are_not_scanned():
    compiled, _, _ = _compiled("mistral", True)
    model, placements = compiled.model, dict(compiled.plan.placements)
    rep = model.scan.repetition
    node = model.proto.graph.node[rep.layer_nodes(1)[0]]
    key = next(k for k in placements if k.node == node.name)
    del placements[key]  # layer 1's first node without the spec layer 0's has
    why = layer_specs_differ(model.proto, model.scan, placements, model.params)
    assert why.startswith(f"node {node.name!r} {key.kind}put {key.position}") and "first layer's specs" in why
    assert layer_specs_differ(model.proto, model.scan, compiled.plan.placements, model.params) == ""
    with pytest.raises(NodeError, match="scan_layers=True: cannot run the layers as a scan"):
        model.unscan(why)


def test_sharded_scan_is_said_in_the_report():
    compiled, _, _ = _compiled("mistral", True)
    notes = compiled.report().notes
    assert notes[0].startswith("2 repeated layers of 60 nodes run as one lax.scan")
    assert notes[1] == (
        "the collectives above are the program text's: the while loop's body (one layer) holds all-reduce 2 "
        "and runs 2 times, so a call runs all-reduce 5"
    )
    unrolled, _, _ = _compiled("mistral", False)
    assert unrolled.report().notes[0] == "layers unrolled: scan_layers=False"


def _first_layer_only(layers: int) -> onnx.ModelProto:
    """bench's tiny transformer (scanned by "auto") with one spec: layer 0's first FFN weight column-parallel
    on 2 devices; every other layer unannotated, so the plan gives the layers different specs."""
    from sharding import add_configuration, parse_spec, set_spec

    sys.path.insert(0, str(ZOO.parents[2] / "bench"))
    from tiny_transformer import tiny_transformer

    model = tiny_transformer(layers)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    add_configuration(model, "tp", 2)
    reader = next(n for n in model.graph.node if "l0_w1" in n.input)
    set_spec(model, reader.name, parse_spec("1:2 @ [0,1]", "l0_w1"), "tp")
    return model


def test_compiled_never_changes_the_model_it_is_given():
    """The plan decides the scan where it is made (spmd.translate_for); Compiled refuses a scanned model whose
    layers the plan gives different specs, and leaves it as it was (before: unrolled in place)."""
    from onnxruntime_reference import onnxruntime_outputs

    from onnx2jax.runtime.plan import make_plan
    from onnx2jax.runtime.spmd import Compiled
    from onnx2jax.scan import AUTO_MIN_LAYERS

    proto = _first_layer_only(AUTO_MIN_LAYERS)
    x = np.random.default_rng(0).standard_normal((2, 3, 64)).astype(np.float32)
    (reference,) = onnxruntime_outputs(proto, {"x": x})
    given = onnx2jax.translate(proto)
    assert given.scan.active
    with pytest.raises(ValueError, match="cannot keep: node .* first layer's specs"):
        Compiled(given, make_plan(proto).program)
    assert given.scan.active and "run as one lax.scan" in given.layers_report()
    np.testing.assert_allclose(np.asarray(given(x)[0]), reference, atol=1e-5, rtol=1e-5)  # still usable
    unannotated = onnx.ModelProto()
    unannotated.CopyFrom(proto)
    del unannotated.configuration[:]
    for node in unannotated.graph.node:
        del node.device_configurations[:]
    kept = Compiled(given, make_plan(unannotated).program)  # a plan the scan fits: the given model, as it was
    assert kept.model is given and given.scan.active
    np.testing.assert_allclose(np.asarray(kept(x)[0]), reference, atol=1e-5, rtol=1e-5)
    compiled = onnx2jax.compile(proto)  # the front door translates for its plan: unrolled, and says why
    assert not compiled.model.scan.active and "first layer's specs" in compiled.model.layers_report()
    np.testing.assert_allclose(np.asarray(compiled(x)[0]), reference, atol=1e-5, rtol=1e-5)
