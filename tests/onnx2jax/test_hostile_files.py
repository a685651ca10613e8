"""Broken and hostile model files are refused by name (ModelLoadError) by translate, compile and the CLI.

Generated one fault at a time from valid models (a small graph with float and
int64 initializers, and tests/data/tiny_llama.onnx): an ir_version or opset
this onnx does not know, an initializer whose dims or raw bytes disagree with
its data, two producers of one tensor (or a node writing a graph input or an
initializer), and external-data offsets and lengths that are no byte count.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import onnx2jax
from onnx2jax.cli.app import main as cli_main
from onnx2jax.errors import ModelLoadError

DATA = Path(__file__).resolve().parents[1] / "data"
REFUSED = "refused by name"


def small() -> onnx.ModelProto:
    """y = reshape(x @ w + b, shape): float and int64 initializers."""
    rng = np.random.default_rng(0)
    inits = [
        onh.from_array(rng.standard_normal((4, 6)).astype(np.float32), "w"),
        onh.from_array(rng.standard_normal(6).astype(np.float32), "b"),
        onh.from_array(np.array([-1, 3, 2], np.int64), "shape"),
    ]
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["xw"], name="mm"),
        oh.make_node("Add", ["xw", "b"], ["h"], name="add"),
        oh.make_node("Reshape", ["h", "shape"], ["y"], name="reshape"),
    ]
    graph = oh.make_graph(
        nodes,
        "small",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)])


@dataclasses.dataclass(frozen=True)
class Hostile:
    fault: str
    words: str  # what the ModelLoadError must say


@st.composite
def hostile(draw) -> tuple[onnx.ModelProto, Hostile, dict]:
    """(model, Hostile, external files {name: bytes}): a valid model made unreadable in one way."""
    model = small() if draw(st.booleans()) else onnx.load(DATA / "tiny_llama.onnx")
    fault = draw(
        st.sampled_from(["ir_version", "opset", "dims", "raw_data", "two_writers", "writes_input", "offset", "length"])
    )
    files: dict[str, bytes] = {}
    inits = [t for t in model.graph.initializer if t.dims and np.prod(t.dims) > 0]
    if fault == "ir_version":
        model.ir_version = draw(st.integers(onnx.IR_VERSION + 1, 2**40))
        return model, Hostile(fault, f"ir_version {model.ir_version}"), files
    if fault == "opset":
        model.opset_import[0].version = draw(st.one_of(st.integers(onnx.defs.onnx_opset_version() + 1, 10**6), st.integers(-5, 0)))
        return model, Hostile(fault, f"opset {model.opset_import[0].version}"), files
    tensor = draw(st.sampled_from(inits))
    if fault == "dims":
        count = int(np.prod(tensor.dims))
        dims = draw(st.lists(st.integers(1, 2**20), min_size=1, max_size=4).filter(lambda d: int(np.prod(d)) != count))
        del tensor.dims[:]
        tensor.dims.extend(dims)
        return model, Hostile(fault, f"tensor {tensor.name!r}"), files
    if fault == "raw_data":
        array = onh.to_array(tensor)
        tensor.ClearField("float_data")
        tensor.raw_data = array.tobytes()[: draw(st.integers(0, array.nbytes - 1))]
        return model, Hostile(fault, f"tensor {tensor.name!r}"), files
    if fault in ("two_writers", "writes_input"):
        nodes = [n for n in model.graph.node if n.output]
        node = draw(st.sampled_from(nodes))
        if fault == "two_writers":
            others = [o for n in model.graph.node if n is not node for o in n.output if o]
            name = draw(st.sampled_from(others))
        else:
            name = draw(st.sampled_from([i.name for i in model.graph.input] + [t.name for t in model.graph.initializer]))
        node.output[0] = name
        return model, Hostile(fault, f"tensor {name!r}"), files
    array = onh.to_array(tensor)
    files["weights.bin"] = array.tobytes()
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
        tensor.ClearField(field)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    bad = draw(st.sampled_from(["-64", "abc", "", "1e3", "-1", "0x10"]))
    entries = {"location": "weights.bin", fault: bad}
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=value)
    return model, Hostile(fault, f"tensor {tensor.name!r}"), files


def load_outcomes(model: onnx.ModelProto, fault: Hostile, files: dict) -> dict[str, str]:
    """How translate, compile and ``onnx2jax check`` end on a hostile file."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        for name, fn in (("translate", onnx2jax.translate), ("compile", onnx2jax.compile)):
            try:
                fn(path)
                results[name] = "ran"
            except ModelLoadError as e:
                results[name] = REFUSED if fault.words in str(e) else f"refused, not by name: {e}"
            except Exception as e:  # noqa: BLE001
                results[name] = f"crashed: {type(e).__name__}: {str(e)[:80]}"
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = cli_main(["check", path])
        except Exception as e:  # noqa: BLE001
            status = f"crashed: {type(e).__name__}"
        said = err.getvalue()
        if status == 1 and said.startswith("onnx2jax check: error: ") and "Traceback" not in said:
            results["cli"] = REFUSED if fault.words in said else f"refused, not by name: {said}"
        else:
            results["cli"] = f"exit {status}: {said[:200]}"
    return results


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile())
def test_hostile_files_are_refused_by_name(case):
    model, fault, files = case
    assert load_outcomes(model, fault, files) == {"translate": REFUSED, "compile": REFUSED, "cli": REFUSED}


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile())
def test_hostile_files_are_refused_by_name_many(case):
    model, fault, files = case
    assert load_outcomes(model, fault, files) == {"translate": REFUSED, "compile": REFUSED, "cli": REFUSED}


def refusal(model, files=None, call=onnx2jax.translate) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(model, path)
        for name, data in (files or {}).items():
            Path(tmp, name).write_bytes(data)
        with pytest.raises(ModelLoadError) as info:
            call(path)
    return str(info.value)


# Regression tests: each of these escaped as onnx's or numpy's own error, or ran.


@pytest.mark.parametrize("offset", ["-64", "abc"])
def test_external_data_offset_that_is_no_byte_count(offset):
    model = small()
    w = model.graph.initializer[0]
    data = onh.to_array(w).tobytes()
    w.ClearField("raw_data")
    w.ClearField("float_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    w.external_data.add(key="location", value="w.bin")
    w.external_data.add(key="offset", value=offset)
    for call in (onnx2jax.translate, onnx2jax.compile):
        message = refusal(model, {"w.bin": data}, call)
        assert "tensor 'w'" in message and f"'offset': '{offset}'" in message


def test_dims_of_2_to_the_40_with_4_values():
    model = small()
    model.graph.initializer[0].CopyFrom(
        onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[2**20, 2**20], float_data=[1, 2, 3, 4])
    )
    for call in (onnx2jax.translate, onnx2jax.compile, onnx2jax.load_model):
        message = refusal(model, call=call)
        assert "tensor 'w'" in message and "1,099,511,627,776 elements" in message and "holds 4 values" in message


def test_a_constant_whose_raw_data_is_short():
    model = small()
    value = onh.from_array(np.ones((3, 3), np.float32), "c")
    value.raw_data = value.raw_data[:-4]
    model.graph.node.insert(0, oh.make_node("Constant", [], ["c"], name="const", value=value))
    assert "attribute 'value' of node 'const' (Constant)" in refusal(model)


def test_opset_and_ir_version_from_the_future():
    model = small()
    model.opset_import[0].version = 99
    assert "opset 99 of domain 'ai.onnx'" in refusal(model)
    model = small()
    model.ir_version = 99
    assert "ir_version 99" in refusal(model)


def test_two_nodes_writing_one_tensor():
    model = small()
    model.graph.node.append(oh.make_node("Relu", ["x"], ["xw"], name="relu"))
    message = refusal(model)
    assert "tensor 'xw' in the main graph is written by node 'mm' (MatMul) and by node 'relu' (Relu)" in message


def test_a_node_writing_an_initializer_in_a_subgraph():
    model = small()
    branch = oh.make_graph(
        [oh.make_node("Identity", ["x"], ["k"], name="inner")],
        "then",
        [],
        [oh.make_tensor_value_info("k", onnx.TensorProto.FLOAT, None)],
        [onh.from_array(np.zeros(2, np.float32), "k")],
    )
    model.graph.node.append(oh.make_node("If", ["cond"], ["z"], name="if", then_branch=branch, else_branch=branch))
    model.graph.input.append(oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []))
    assert "_branch' of node 'if' (If) is written by an initializer and by node 'inner'" in refusal(model)


def test_cli_check_refuses_a_hostile_file_without_a_traceback(tmp_path):
    import subprocess
    import sys

    model = small()
    model.ir_version = 99
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", code, "check", str(path)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2], timeout=300)
    assert run.returncode == 1
    assert "onnx2jax check: error: " in run.stderr and "ir_version 99" in run.stderr
    assert "Traceback" not in run.stderr + run.stdout
