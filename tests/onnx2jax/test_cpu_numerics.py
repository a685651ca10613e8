"""Two XLA CPU behaviours that made ONNX's light SqueezeNet and ResNet-50 come back all-NaN.

1. XLA's YNNPACK ``REDUCE`` fusion returns garbage for a reduction of a dot or
   convolution with a broadcast operand; onnx2jax compiles without that fusion
   type (``onnx2jax.xla_options``).
2. XLA duplicates an elementwise producer (a mean's ``* 1/n``) into the max and
   the subtract of ``x - max(x)`` and contracts the latter into an FMA, so the
   shift can be positive and exp overflows; Softmax and its relatives clamp at
   the max first (``onnx2jax.ops.softmax.shifted_by_max``).

References are numpy and onnxruntime. docs/known-issues.md has the plain-JAX
reproducers.
"""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

from onnx2jax import translate
from onnx2jax.xla_options import compiler_options

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA CPU behaviour")

# float32 with (x * (1/169)) rounded 511 below its exact value: an FMA shift of +511.
_HUGE = np.float32(1.6026038e12)


def _conv_sum(x):
    weight = jnp.ones((64, 64, 1, 1), jnp.float32)  # a broadcast constant in HLO
    y = jax.lax.conv_general_dilated(x, weight, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y.sum(axis=(2, 3))


@cpu_only
def test_reduce_of_conv_with_broadcast_weights_is_right_with_onnx2jax_options():
    x = np.ones((1, 64, 8, 8), np.float32)
    expected = np.full((1, 64), 64 * 8 * 8, np.float32)  # numpy: each output sums 64 * 64 ones
    for _ in range(3):  # the broken fusion gave a different value at each compile
        got = jax.jit(_conv_sum, compiler_options=compiler_options("cpu"))(x)
        np.testing.assert_array_equal(np.asarray(got), expected)


@cpu_only
def test_upstream_ynn_reduce_fusion_is_still_broken():
    """Fails once jaxlib's default YNNPACK fusions get this right: then onnx2jax.xla_options can go."""
    if "xla_cpu_experimental_ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        pytest.skip("XLA_FLAGS sets the YNNPACK fusion types, so XLA's default is not what runs")
    x = np.ones((1, 64, 8, 8), np.float32)
    got = np.asarray(jax.jit(_conv_sum)(x))
    assert not np.array_equal(got, np.full((1, 64), 4096, np.float32)), (
        "XLA CPU's default YNNPACK REDUCE fusion now sums conv(ones, ones) right: "
        "drop the workaround in onnx2jax/xla_options.py and docs/known-issues.md"
    )


def test_compiler_options_only_on_cpu_and_never_over_the_users_flags(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiler_options("cpu") == {
        "xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION"
    }
    assert compiler_options("cpu", in_place_loops=True)["xla_cpu_copy_insertion_use_region_analysis"] is True
    assert compiler_options("gpu") == {} == compiler_options("gpu", in_place_loops=True)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_experimental_ynn_fusion_type= --xla_cpu_copy_insertion_use_region_analysis=false")
    assert compiler_options("cpu") == {} == compiler_options("cpu", in_place_loops=True)


def _model(op: str, attrs: dict, opset: int = 13) -> onnx.ModelProto:
    """x (1, 1000) -> Mul by 1/169 -> op: the product is what XLA duplicates and contracts."""
    scale = oh.make_tensor("scale", onnx.TensorProto.FLOAT, [], [np.float32(1 / 169)])
    nodes = [oh.make_node("Mul", ["x", "scale"], ["scaled"]), oh.make_node(op, ["scaled"], ["y"], **attrs)]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1000])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [scale],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "op, attrs, opset",
    [
        ("Softmax", {"axis": 1}, 13),
        ("Softmax", {"axis": 1}, 11),
        ("LogSoftmax", {"axis": 1}, 13),
        ("ReduceLogSumExp", {"axes": [1], "keepdims": 1}, 13),
    ],
)
@pytest.mark.parametrize("spread", [False, True])
def test_exp_normalisations_of_huge_scaled_logits_match_onnxruntime(op, attrs, opset, spread):
    x = np.full((1, 1000), _HUGE, np.float32)
    if spread:  # a few distinct values, a few ulps apart
        x = x + np.float32(131072) * (np.arange(1000) % 3).astype(np.float32)
    model = _model(op, attrs, opset)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    (got,) = translate(model)(x)
    got = np.asarray(got)
    assert np.isfinite(got).all(), f"{op}: {np.isnan(got).sum()} NaN, {np.isinf(got).sum()} inf"
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_softmax_of_ordinary_values_and_its_gradient_are_jax_nn_softmax():
    from onnx2jax.ops.softmax import stable_log_softmax, stable_softmax

    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    x[1, 2] = -np.inf
    np.testing.assert_allclose(stable_softmax(x, 1), jax.nn.softmax(x, axis=1), rtol=1e-6)
    np.testing.assert_allclose(stable_log_softmax(x, 1), jax.nn.log_softmax(x, axis=1), rtol=1e-6)
    weights = np.arange(7, dtype=np.float32)
    ours = jax.grad(lambda v: (stable_softmax(v, 1) * weights).sum())(x)
    theirs = jax.grad(lambda v: (jax.nn.softmax(v, axis=1) * weights).sum())(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-7)
    nan_row = np.array([[np.nan, 1.0]], np.float32)
    assert np.isnan(np.asarray(stable_softmax(nan_row, 1))).all()  # as jax.nn.softmax and onnxruntime


_LIGHT_RUN = """
import os, sys
import numpy as np, onnx
from onnx2jax import translate
from onnx2jax.conformance import assert_outputs_match
name, compiles = sys.argv[1], int(sys.argv[2])
light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
proto = onnx.load(os.path.join(light, f"light_{name}.onnx"))
expected = onnx.numpy_helper.to_array(onnx.load_tensor(os.path.join(light, f"light_{name}_output_0.pb")))
for _ in range(compiles):  # a fresh JaxModel compiles its own executable
    model = translate(proto)
    info = next(i for i in proto.graph.input if i.name == model.input_names[0])
    shape = tuple(d.dim_value for d in info.type.tensor_type.shape.dim)
    x = (np.arange(int(np.prod(shape))).reshape(shape) / np.prod(shape)).astype(np.float32)
    (y,) = model(x)
    y = np.asarray(y)
    assert np.isfinite(y).all(), f"{name}: {np.isnan(y).sum()} NaN of {y.size}"
    assert_outputs_match(expected, y, 1e-3, 1e-7, name)
print("ok")
"""


def _fresh_process_runs(name: str, processes: int, compiles: int) -> None:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    for run in range(processes):
        result = subprocess.run(
            [sys.executable, "-c", _LIGHT_RUN, name, str(compiles)], capture_output=True, text=True, env=env, cwd=repo
        )
        assert result.returncode == 0, f"{name}, process {run}: {result.stderr[-2000:]}"


@cpu_only
@pytest.mark.parametrize("name", ["squeezenet", pytest.param("resnet50", marks=pytest.mark.slow)])
def test_light_cnns_in_a_fresh_process_are_finite_and_right(name):
    # Before the fix about half of SqueezeNet's compiles gave NaN; two compiles in a fresh process.
    _fresh_process_runs(name, processes=1, compiles=2)


@pytest.mark.slow
@cpu_only
@pytest.mark.parametrize("name", ["squeezenet", "resnet50"])
def test_light_cnns_in_many_fresh_processes_are_finite_and_right(name):
    _fresh_process_runs(name, processes=5, compiles=3)


def _sqrt_model(path) -> str:
    graph = oh.make_graph(
        [oh.make_node("Sqrt", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)]), path)
    return str(path)


def test_run_check_fails_on_nan_where_onnxruntime_is_finite(tmp_path, capsys, monkeypatch):
    from onnx2jax import cli
    from onnx2jax.cli import run as cli_run

    model = _sqrt_model(tmp_path / "sqrt.onnx")
    np.save(tmp_path / "x.npy", np.array([4.0, -1.0, np.inf], np.float32))
    argv = ["run", model, "--input", f"x={tmp_path / 'x.npy'}", "--check"]
    # onnxruntime itself: sqrt(-1) is NaN and sqrt(inf) inf on both sides, so the check passes.
    assert cli.main(argv) == 0
    capsys.readouterr()
    # A reference that is finite where onnx2jax gives NaN and inf (as the light CNNs' softmax once did).
    monkeypatch.setattr(cli_run, "_onnxruntime_outputs", lambda path, inputs: ([np.array([2.0, 0.0, 1.0], np.float32)], None))
    assert cli.main(argv) == 1
    error = capsys.readouterr().err.strip()
    assert error == "onnx2jax run: error: y: 1 NaN and 1 inf where onnxruntime's output is finite"
