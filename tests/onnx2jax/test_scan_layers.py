"""Repeated layers: detection on real exports (onnx2jax.layers) and running them as one lax.scan (onnx2jax.scan).

References: the exports' own module naming (each node's torch ``namespace``
metadata names its layer), onnxruntime's stored outputs, and the unrolled run.
"""

from __future__ import annotations

import collections
import pathlib
import re
import sys

import jax
import numpy as np
import onnx
import pytest

import onnx2jax
from onnx2jax.errors import NodeError
from onnx2jax.layers import find_repeated_layers

ROOT = pathlib.Path(__file__).resolve().parents[2]
ZOO = ROOT / "tests" / "data" / "zoo"
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "bench"))
from tiny_transformer import tiny_transformer  # noqa: E402
from onnxruntime_reference import onnxruntime_outputs  # noqa: E402

# Layers found per export (0: none, and a word the reason must contain). Checked independently below
# against the torch module path in each node's metadata.
EXPECTED = {
    "mistral": 2, "qwen2": 2, "phi3": 2, "gpt_neox": 2, "qwen2_moe": 2, "roberta": 2, "t5": 2, "vit": 2,
    "wav2vec2": 2, "tiny_llama": 2, "tiny_bert": 2,
    # GPT-2-style: the block that starts at the token + position embedding Add also repeats, but would carry
    # the [1, seq, 64] position embedding as a [batch, seq, 64] stream; the phase one node later is the layer.
    "gpt2": 2, "gpt_bigcode": 2, "tiny_gpt2": 2,
    "resnet": (0, "no block"), "convnext": (0, "no block"),
}
_LAYER_INDEX = re.compile(r"(?:layers|encoder\.layer|\.h|block)\.(\d+)[:.]")


def _path(name: str) -> pathlib.Path:
    return DATA / f"{name}.onnx" if name.startswith("tiny_") else ZOO / f"{name}.onnx"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_detection_matches_the_exports_module_naming(name):
    model = onnx.load(_path(name))
    found = find_repeated_layers(model.graph)
    expected = EXPECTED[name]
    assert len(found.carry_in) <= 1, found.carry_in  # cut at the residual stream
    if isinstance(expected, tuple):
        assert not found.found and expected[1] in found.reason, found.reason
        return
    assert found.count == expected, found.reason
    # Independent check: the torch module each node came from names its layer index. Each block's
    # nodes come (all but at most two cut at a residual boundary) from layer k.
    for k in range(found.count):
        indices = collections.Counter()
        for i in found.layer_nodes(k):
            namespace = "".join(p.value for p in model.graph.node[i].metadata_props if p.key == "namespace")
            matches = _LAYER_INDEX.findall(namespace)
            if matches:
                indices[int(matches[0])] += 1
        (top, hits), = indices.most_common(1)
        assert top == k and hits >= sum(indices.values()) - 2, (k, indices)
    # Every MatMul/Gemm weight of the first layer is a stacked slot, one distinct initializer per layer.
    inits = {i.name for i in model.graph.initializer}
    weights = [n.input[1] for n in (model.graph.node[i] for i in found.layer_nodes(0)) if n.op_type in ("MatMul", "Gemm") and n.input[1] in inits]
    assert weights and all(w in found.stacked for w in weights)
    assert all(len(set(found.stacked[w])) == found.count for w in weights)


@pytest.mark.parametrize("layers", [2, 8, 32])
def test_tiny_transformer_layers_and_their_parameters(layers):
    found = find_repeated_layers(tiny_transformer(layers).graph)
    assert found.count == layers and found.length == 24 and found.carry_in == ("x",)
    # bench/tiny_transformer.py names layer k's weights l{k}_*. LayerNorm gains/biases are ones/zeros in
    # every layer, but each layer has its own: parameters are told apart by name, never by value (issue 41:
    # no weight is read to find the layers), so they are stacked; what every layer reads by one name is shared.
    weights = ("wqkv", "wo", "w1", "w2", "ln1_g", "ln1_b", "ln2_g", "ln2_b")
    assert dict(found.stacked) == {f"l0_{w}": tuple(f"l{k}_{w}" for k in range(layers)) for w in weights}
    assert set(found.shared) >= {"scale", "heads_shape"}


def _has_scan(model: onnx2jax.JaxModel, *inputs) -> bool:
    with jax.enable_x64(model.uses_64bit):
        jaxpr = jax.make_jaxpr(lambda *xs: model.fn(model.params, *xs))(*inputs)
    return "scan" in str(jaxpr)


def test_scanned_equals_unrolled_and_onnxruntime_tiny_transformer():
    model = tiny_transformer(8)
    x = np.random.default_rng(0).standard_normal((2, 16, 64)).astype(np.float32)
    (reference,) = onnxruntime_outputs(model, {"x": x})
    scanned = onnx2jax.translate(model, scan_layers=True)
    unrolled = onnx2jax.translate(model, scan_layers=False)
    assert _has_scan(scanned, x) and not _has_scan(unrolled, x)
    (a,), (b,) = scanned(x), unrolled(x)
    np.testing.assert_allclose(a, reference, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
    assert scanned.layers_report().startswith("8 repeated layers of 24 nodes run as one lax.scan")


@pytest.mark.parametrize(
    "name",
    ["t5", "gpt2"] + [pytest.param(n, marks=pytest.mark.slow) for n in ("mistral", "qwen2_moe", "wav2vec2", "gpt_bigcode")],
)
def test_scanned_zoo_model_equals_onnxruntime(name):
    inputs = dict(np.load(ZOO / f"{name}.inputs.npz"))
    reference = dict(np.load(ZOO / f"{name}.ort_outputs.npz"))
    model = onnx2jax.translate(ZOO / f"{name}.onnx", scan_layers=True)
    assert model.scan.active
    outputs = model(**inputs)
    for out_name, value in zip(model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[out_name], atol=1e-4, rtol=1e-4)


def test_fn_with_per_layer_params_stacks_them_in_the_trace():
    """``model.fn(params)`` keeps the per-layer parameter names (differentiable); the scan stacks them."""
    model = onnx2jax.translate(tiny_transformer(4), scan_layers=True)
    x = np.random.default_rng(1).standard_normal((1, 8, 64)).astype(np.float32)
    params = dict(model.params)
    params["l2_w1"] = params["l2_w1"] * 0  # layer 2's MLP off: a per-layer edit must reach that layer only
    edited = onnx.load_from_string(tiny_transformer(4).SerializeToString())
    for init in edited.graph.initializer:
        if init.name == "l2_w1":
            init.CopyFrom(onnx.numpy_helper.from_array(params["l2_w1"], "l2_w1"))
    (reference,) = onnxruntime_outputs(edited, {"x": x})
    with jax.enable_x64(True):  # the model's shape vectors are int64
        (value,) = jax.jit(model.fn)(params, x)
    np.testing.assert_allclose(value, reference, atol=2e-5, rtol=1e-5)


def test_auto_policy_scans_deep_models_and_says_why_not_for_shallow_ones():
    from onnx2jax.scan import AUTO_MIN_LAYERS

    shallow = onnx2jax.translate(tiny_transformer(2))
    assert not shallow.scan.active
    assert "2 repeated layers" in shallow.layers_report() and f"fewer than {AUTO_MIN_LAYERS}" in shallow.layers_report()
    deep = onnx2jax.translate(tiny_transformer(AUTO_MIN_LAYERS))
    assert deep.scan.active
    off = onnx2jax.translate(tiny_transformer(8), scan_layers=False)
    assert not off.scan.active and "scan_layers=False" in off.layers_report()


def test_scan_layers_true_refuses_with_the_reason():
    with pytest.raises(NodeError, match="no repeated layer: no block"):
        onnx2jax.translate(ZOO / "resnet.onnx", scan_layers=True)
    with pytest.raises(ValueError, match="scan_layers must be"):
        onnx2jax.translate(tiny_transformer(2), scan_layers="yes")
    unrolled = onnx2jax.translate(ZOO / "resnet.onnx")
    assert unrolled.layers_report().startswith("layers unrolled: no repeated layer")


def test_a_per_layer_shape_constant_that_differs_is_not_stacked():
    """Layer 1 reshapes with [0, 0, -1, 16] where layer 0 uses [0, 0, 4, 16]: same result, but a
    stacked shape would be a traced value, so the scan is refused, naming the initializer."""
    model = tiny_transformer(4)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0, 0, -1, 16], np.int64), "heads_shape_b"))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([0, 0, 4, 16], np.int64), "heads_shape_a"))
    for node in model.graph.node:
        if node.op_type == "Reshape" and node.input[1] == "heads_shape":
            node.input[1] = "heads_shape_b" if node.input[0].startswith("l1_") else "heads_shape_a"
    with pytest.raises(NodeError, match="'heads_shape_a' differs between layers and is a compile-time constant"):
        onnx2jax.translate(model, scan_layers=True)
    auto = onnx2jax.translate(model)
    assert not auto.scan.active and "heads_shape_a" in auto.layers_report()
    x = np.random.default_rng(2).standard_normal((2, 4, 64)).astype(np.float32)
    np.testing.assert_allclose(auto(x)[0], onnxruntime_outputs(model, {"x": x})[0], atol=2e-5, rtol=1e-5)


def test_cli_run_says_which_form_ran(tmp_path, capsys):
    from onnx2jax.cli.app import main

    path = tmp_path / "tiny4.onnx"
    onnx.save(tiny_transformer(4), path)
    assert main(["run", str(path), "--check", "--dim", "batch=2", "--dim", "seq=4", "--verbose"]) == 0
    assert "4 repeated layers of 24 nodes, fewer than 16" in capsys.readouterr().out
    assert main(["run", str(path), "--check", "--scan-layers", "on", "--dim", "batch=2", "--dim", "seq=4", "-v"]) == 0
    assert "4 repeated layers of 24 nodes run as one lax.scan" in capsys.readouterr().out
    assert main(["run", str(path), "--scan-layers", "off", "-v"]) == 0
    assert "layers unrolled: scan_layers=False" in capsys.readouterr().out


def test_auto_leaves_a_parameter_free_chain_unrolled():
    """A chain of identical parameter-free ops repeats too, but XLA fuses it unrolled: "auto" says so."""
    from onnx import TensorProto, helper

    ops = ["Relu", "Neg", "Exp", "Tanh"]
    nodes = [helper.make_node(ops[i % 4], [f"t{i}"], [f"t{i + 1}"]) for i in range(40)]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("t40", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    auto = onnx2jax.translate(model)
    assert not auto.scan.active and "hold no per-layer parameters" in auto.layers_report()
    forced = onnx2jax.translate(model, scan_layers=True)
    assert forced.scan.active and forced.scan.repetition.count == 10
    x = np.array([-0.5, 0.1, 0.7], np.float32)
    expected = x
    for _ in range(10):
        expected = np.tanh(np.exp(-np.maximum(expected, 0)))
    np.testing.assert_allclose(forced(x)[0], expected, rtol=1e-6)
    np.testing.assert_allclose(auto(x)[0], expected, rtol=1e-6)


def test_a_carry_that_changes_shape_at_run_time_runs_unrolled_and_says_why():
    """Each layer's down projection is a batch of 2 matrices: a batch-1 stream comes out batch 2. The export
    records no intermediate shapes, so detection cannot see it; lax.scan rejects the carry while tracing and
    "auto" runs the layers unrolled (reading each layer's slice of the stacked parameters)."""
    from onnx2jax.scan import AUTO_MIN_LAYERS

    model = tiny_transformer(AUTO_MIN_LAYERS)
    rng = np.random.default_rng(3)
    for init in model.graph.initializer:
        if init.name.endswith("_w2"):
            init.CopyFrom(onnx.numpy_helper.from_array((rng.standard_normal((2, 256, 64)) * 0.05).astype(np.float32), init.name))
    x = np.random.default_rng(4).standard_normal((1, 4, 64)).astype(np.float32)
    (reference,) = onnxruntime_outputs(model, {"x": x})
    auto = onnx2jax.translate(model)
    assert auto.scan.active
    np.testing.assert_allclose(auto(x)[0], reference, atol=2e-5, rtol=1e-5)
    assert auto.layers_report().startswith("layers unrolled: a layer's output differs in shape or dtype from its input")
    with pytest.raises(NodeError, match="scan_layers=True: cannot run the layers as a scan: a layer's output differs"):
        onnx2jax.translate(model, scan_layers=True)(x)
