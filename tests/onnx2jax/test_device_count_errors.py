"""Too few devices, a mesh of the wrong size, and sharding errors at the command line: one clear message each.

``onnx2jax.compile`` names the count a configuration needs and how to get it
(fake CPU devices through ``XLA_FLAGS``); the CLI prints a model's sharding
errors as one line (code, node, tensor, axis of the first) and the rest on
indented lines, exit 1, no traceback unless ``--debug``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.runtime.plan import program_plan
from onnx2jax.errors import DeviceCountError
from sharding import ShardingError, add_configuration, annotate_tensor, parse_spec

ROOT = Path(__file__).resolve().parents[2]
XLA_HINT = "XLA_FLAGS=--xla_force_host_platform_device_count=8"


def _matmul(spec_x: str, spec_w: str, devices: int) -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "mm",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 8])],
        [onh.from_array(np.ones((4, 8), np.float32), "W")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    add_configuration(model, "tp", devices)
    annotate_tensor(model, "x", parse_spec(spec_x, "x"), "tp")
    annotate_tensor(model, "W", parse_spec(spec_w, "W"), "tp")
    return model


def test_compile_with_too_few_jax_devices_names_the_count_and_the_flag():
    model = _matmul("replicated @ [{0,1,2,3,4,5,6,7}]", "1:8 @ [0,1,2,3,4,5,6,7]", 8)
    with pytest.raises(DeviceCountError) as caught:
        program_plan(model, "tp", None, jax_devices=jax.devices()[:4])
    error = caught.value
    assert isinstance(error, ValueError)  # what it was before it had a class of its own
    assert (error.needed, error.available, error.configuration) == (8, 4, "tp")
    assert str(error).startswith("configuration 'tp' needs 8 devices, JAX has 4; ")
    assert XLA_HINT in str(error)


def test_set_mesh_of_the_wrong_size_names_both_counts():
    model = _matmul("replicated @ [{0,1,2,3,4,5,6,7}]", "1:8 @ [0,1,2,3,4,5,6,7]", 8)
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices()[:4])
    with jax.set_mesh(mesh), pytest.raises(DeviceCountError) as caught:
        onnx2jax.compile(model)
    message = str(caught.value)
    assert message.startswith("the mesh has 4 devices but configuration 'tp' has 8: build the mesh over 8 devices")
    assert XLA_HINT not in message  # JAX has 8 devices here: only the mesh is wrong
    with pytest.raises(DeviceCountError, match="the mesh has 4 devices but configuration 'tp' has 8"):
        onnx2jax.compile(model, mesh)


def test_a_process_with_four_cpu_devices_is_told_how_to_get_eight(tmp_path):
    path = tmp_path / "mm8.onnx"
    onnx.save(_matmul("replicated @ [{0,1,2,3,4,5,6,7}]", "1:8 @ [0,1,2,3,4,5,6,7]", 8), path)
    script = textwrap.dedent(f"""
        import jax
        jax.config.update("jax_num_cpu_devices", 4)
        import onnx2jax
        try:
            onnx2jax.compile({str(path)!r})
        except ValueError as e:
            print(type(e).__name__, e)
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("DeviceCountError configuration 'tp' needs 8 devices, JAX has 4; "), done.stdout
    assert XLA_HINT in done.stdout


@pytest.fixture
def malformed(tmp_path) -> Path:
    """Two errors: W's device list names device 9 of a 2-device configuration; x is cut on K, W is not."""
    model = _matmul("1:2 @ [0,1]", "1:2 @ [0,1]", 2)
    node = model.graph.node[0]
    spec = next(s for s in node.device_configurations[0].sharding_spec if s.tensor_name == "W")
    spec.device[1] = 9
    path = tmp_path / "malformed.onnx"
    onnx.save(model, path)
    return path


def test_run_prints_sharding_errors_as_one_line_then_indented_details(malformed, capsys):
    assert main(["run", str(malformed), "--devices", "2"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out
    first, *details = captured.err.rstrip("\n").splitlines()
    assert first.startswith("onnx2jax run: error: ")
    assert "sharding error" in first and " at node 'mm' (MatMul), tensor 'W'" in first
    assert details and all(line.startswith("  error[") for line in details)
    assert any("device-out-of-range" in line and "device 9" in line for line in details)


def test_check_on_the_same_model_exits_1_naming_the_same_error(malformed, capsys):
    assert main(["check", str(malformed), "--json"]) == 1
    import json

    report = json.loads(capsys.readouterr().out)
    assert "device-out-of-range" in [d["code"] for d in report["diagnostics"] if d["severity"] == "error"]


def test_debug_shows_the_exception(malformed):
    with pytest.raises(ShardingError):
        main(["run", str(malformed), "--devices", "2", "--debug"])


def test_generate_on_more_devices_than_jax_has_says_how_to_get_them():
    """The issue's first stumble: the generation block at devices=2 on one CPU device. Here 16 > 8."""
    import onnx2jax
    from onnx2jax.errors import DeviceCountError

    with pytest.raises(DeviceCountError, match=r"the model needs 16 devices, JAX has 8; on CPU, start Python with XLA_FLAGS"):
        onnx2jax.generate(onnx2jax.data_path("llama_gqa_torch"), [1, 42], max_new_tokens=1, devices=16)
