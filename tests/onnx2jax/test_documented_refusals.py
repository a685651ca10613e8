"""Refusals that are documented errors, not plain ValueErrors: a graph with a cycle (``ModelLoadError``) and a
model with several device configurations and none chosen (``ConfigurationError``), from Python and the CLI;
and ``check`` saying which configuration it checked. The reference for the accepted runs is the unsharded run.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnx2jax
import sharding
from onnx2jax.cli.app import main
from onnx2jax.errors import ConfigurationError, ModelLoadError
from sharding.annotate import add_configuration, set_stage


def _cycle() -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "b"], ["a"], name="n1"), oh.make_node("Relu", ["a"], ["b"], name="n2")],
        "cycle", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("b", onnx.TensorProto.FLOAT, [2])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


@pytest.mark.parametrize("entry", ["translate", "compile", "check"])
def test_a_cycle_is_a_model_load_error_naming_its_nodes(entry):
    run = {
        "translate": lambda m: onnx2jax.translate(m)(np.ones(2, np.float32)),
        "compile": lambda m: onnx2jax.compile(m)(np.ones(2, np.float32)),
        "check": sharding.check,
    }[entry]
    with pytest.raises(ModelLoadError, match=r"the graph has a cycle through nodes \['n1', 'n2'\]"):
        run(_cycle())


def test_a_cycle_on_the_command_line_is_one_line(tmp_path, capsys):
    path = tmp_path / "cycle.onnx"
    onnx.save(_cycle(), path)
    assert main(["run", str(path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx2jax run: error: the graph has a cycle through nodes ['n1', 'n2']") and "\n" not in err


def _two_configurations() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w0"], ["h"], name="first"), oh.make_node("MatMul", ["h", "w1"], ["y"], name="second")],
        "two", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 4])],
        [onh.from_array(rng.normal(size=(4, 4)).astype(np.float32), w) for w in ("w0", "w1")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    for name in ("a", "b"):
        add_configuration(model, name, 2)
        set_stage(model, "first", 0, name)
        set_stage(model, "second", 1, name)
    return model


def test_several_configurations_raise_a_configuration_error_naming_them():
    model = _two_configurations()
    with pytest.raises(ConfigurationError, match=r"defines 2 device configurations \['a', 'b'\]; choose one") as caught:
        onnx2jax.compile(model)
    assert caught.value.defined == ("a", "b") and caught.value.asked is None
    with pytest.raises(ConfigurationError, match=r"configuration 'c' is not defined in the model; it defines \['a', 'b'\]"):
        onnx2jax.compile(model, configuration="c")
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    (expected,) = onnx2jax.translate(model)(x)
    (got,) = onnx2jax.compile(model, configuration="b")(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6)


def test_check_says_which_configuration_it_checked_and_that_compile_asks(tmp_path, capsys):
    path = tmp_path / "two.onnx"
    onnx.save(_two_configurations(), path)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "checked configuration 'a', the first of ['a', 'b']; onnx2jax.compile and onnx2jax run refuse to guess" in out
    assert main(["explain", str(path)]) == 0
    assert "explained configuration 'a', the first of ['a', 'b']" in capsys.readouterr().out
    assert main(["check", str(path), "--configuration", "b"]) == 0
    assert "checked configuration 'b' of ['a', 'b']" in capsys.readouterr().out
    assert main(["run", str(path), "--devices", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("onnx2jax run: error: the model defines 2 device configurations ['a', 'b']; choose one")
    assert main(["run", str(path), "--devices", "2", "--configuration", "b", "--no-cache"]) == 0
