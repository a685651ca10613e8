"""The translator on small graphs built with onnx.helper, against numpy and onnxruntime."""

import os

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import onnx2jax
from onnx2jax.errors import ModelLoadError, PrecisionError, UnsupportedOpError

FLOAT = onnx.TensorProto.FLOAT


def mlp_model(w: np.ndarray) -> onnx.ModelProto:
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "W"], ["y"], name="mm"), oh.make_node("Relu", ["y"], ["z"], name="relu")],
        "mlp",
        [oh.make_tensor_value_info("x", FLOAT, ["batch", w.shape[0]])],
        [oh.make_tensor_value_info("z", FLOAT, ["batch", w.shape[1]])],
        [onh.from_array(w, "W")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])


def test_matmul_relu_matches_numpy():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    (z,) = onnx2jax.translate(mlp_model(w))(x)
    np.testing.assert_allclose(np.asarray(z), np.maximum(x @ w, 0), rtol=1e-6)
    assert z.dtype == np.float32


def test_fn_is_pure_and_differentiable():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    model = onnx2jax.translate(mlp_model(w))
    assert set(model.params) == {"W"}

    def loss(params):
        return model.fn(params, x)[0].sum()

    grad = jax.jit(jax.grad(loss))(model.params)["W"]
    expected = x.T @ (x @ w > 0).astype(np.float32)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5)
    batched = jax.vmap(lambda xs: model.fn(model.params, xs)[0])(np.stack([x, 2 * x]))
    np.testing.assert_allclose(np.asarray(batched[1]), np.maximum(2 * x @ w, 0), rtol=1e-5)


def test_every_unsupported_op_is_listed_at_once():
    graph = oh.make_graph(
        [
            oh.make_node("FancyOp", ["x"], ["y"], name="a", domain="my.domain"),
            oh.make_node("Relu", ["y"], ["z"], name="b"),
            oh.make_node("NotAnOnnxOp", ["z"], ["w"], name="c"),
        ],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [2])],
        [oh.make_tensor_value_info("w", FLOAT, [2])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("my.domain", 1)])
    with pytest.raises(UnsupportedOpError) as info:
        onnx2jax.translate(model)
    assert info.value.missing == [("", "NotAnOnnxOp", 17), ("my.domain", "FancyOp", 1)]
    assert "my.domain::FancyOp@1" in str(info.value) and "ai.onnx::NotAnOnnxOp@17" in str(info.value)


def test_input_dtype_and_rank_are_checked():
    model = onnx2jax.translate(mlp_model(np.ones((4, 3), np.float32)))
    with pytest.raises(TypeError, match="input 'x': expected dtype float32, got float64"):
        model(np.ones((2, 4)))
    with pytest.raises(TypeError, match="input 'x': expected rank 2"):
        model(np.ones((4,), np.float32))


def test_64bit_model_refuses_to_narrow_silently():
    graph = oh.make_graph(
        [oh.make_node("Add", ["a", "b"], ["c"], name="add")],
        "g",
        [oh.make_tensor_value_info(n, onnx.TensorProto.INT64, [2]) for n in "ab"],
        [oh.make_tensor_value_info("c", onnx.TensorProto.INT64, [2])],
    )
    model = onnx2jax.translate(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    big = np.array([2**40, -(2**40)], np.int64)
    (c,) = model(big, np.array([1, 1], np.int64))
    assert c.dtype == np.int64 and list(np.asarray(c)) == [2**40 + 1, -(2**40) + 1]
    assert not jax.config.jax_enable_x64, "the call must not change JAX's global x64 setting"
    with pytest.raises(PrecisionError, match="enable_x64"):
        model.fn({}, big, big)


def _save_with_external(model: onnx.ModelProto, directory, location: str) -> str:
    path = os.path.join(directory, "m.onnx")
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="w.bin", size_threshold=0)
    saved = onnx.load(path, load_external_data=False)
    for tensor in saved.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(saved, path)
    return path


def test_external_data_loads_from_model_directory(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    path = _save_with_external(mlp_model(w), tmp_path, "w.bin")
    model = onnx2jax.translate(path)
    np.testing.assert_array_equal(model.params["W"], w)


def test_external_data_outside_model_directory_is_refused(tmp_path):
    inner = tmp_path / "model"
    inner.mkdir()
    path = _save_with_external(mlp_model(np.ones((4, 3), np.float32)), inner, "../w.bin")
    os.replace(inner / "w.bin", tmp_path / "w.bin")
    with pytest.raises(ModelLoadError, match="escapes the model's directory"):
        onnx2jax.translate(path)


def test_missing_and_truncated_external_data(tmp_path):
    path = _save_with_external(mlp_model(np.ones((4, 3), np.float32)), tmp_path, "w.bin")
    with open(tmp_path / "w.bin", "r+b") as f:
        f.truncate(20)
    with pytest.raises(ModelLoadError, match="truncated"):
        onnx2jax.translate(path)
    os.remove(tmp_path / "w.bin")
    with pytest.raises(ModelLoadError, match="not found"):
        onnx2jax.translate(path)


def test_truncated_model_file(tmp_path):
    data = mlp_model(np.ones((4, 3), np.float32)).SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        onnx2jax.translate(str(path))


def test_float_initializer_that_sets_a_shape_is_folded():
    """A Resize's scales stored as a float initializer must be known while tracing."""
    import onnxruntime as ort

    graph = oh.make_graph(
        [oh.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest", name="resize")],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [1, 1, 2, 3])],
        [oh.make_tensor_value_info("y", FLOAT, None)],
        [onh.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)])
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    translated = onnx2jax.translate(model)
    assert "scales" in translated.constants and "scales" not in translated.params
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.asarray(translated(x)[0]), expected)


def test_scalar_parameters_are_baked_into_the_called_program():
    """A Pow exponent stored as a float initializer stays a parameter of ``fn`` but is a
    constant of the program ``model(...)`` compiles, so XLA lowers ``x ** 3`` to multiplies."""
    graph = oh.make_graph(
        [oh.make_node("Pow", ["x", "e"], ["y"], name="pow")],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, ["n"])],
        [oh.make_tensor_value_info("y", FLOAT, ["n"])],
        [onh.from_array(np.array(3.0, np.float32), "e")],
    )
    model = onnx2jax.translate(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]))
    assert "e" in model.params
    x = np.linspace(-2, 2, 7, dtype=np.float32)
    np.testing.assert_allclose(np.asarray(model(x)[0]), x**3, rtol=1e-6)
    squared = model.fn({"e": np.float32(2.0)}, x)[0]
    np.testing.assert_allclose(np.asarray(squared), x**2, rtol=1e-6)
    (jitted,) = model._jitted.values()
    hlo = jitted.lower(model._runtime_params(), {"x": x}).compile().as_text()
    assert "power(" not in hlo


def test_external_weights_stay_on_disk_until_placed(tmp_path):
    """open_model memory-maps external initializers instead of reading them into the proto."""
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    path = _save_with_external(mlp_model(w), tmp_path, "w.bin")
    model = onnx2jax.translate(path)
    assert isinstance(model.params["W"], np.memmap)
    x = np.ones((2, 4), np.float32)
    np.testing.assert_array_equal(np.asarray(model(x)[0]), np.maximum(x @ w, 0))


@pytest.mark.slow
def test_model_over_2gb_through_external_data(tmp_path):
    """A 2.1 GB initializer: the .onnx file stays small and the weight is never one protobuf."""
    rows = 550_000_000 // 8
    weight = np.lib.format.open_memmap(tmp_path / "scratch.npy", mode="w+", dtype=np.float32, shape=(rows, 8))
    weight[:] = 1.0
    weight[-1] = np.arange(8, dtype=np.float32)
    with open(tmp_path / "big.bin", "wb") as f:
        f.write(memoryview(np.ascontiguousarray(weight)).cast("B"))
    tensor = onnx.TensorProto(name="W", data_type=FLOAT, dims=[rows, 8], data_location=onnx.TensorProto.EXTERNAL)
    for key, value in (("location", "big.bin"), ("offset", "0"), ("length", str(rows * 8 * 4))):
        tensor.external_data.add(key=key, value=value)
    graph = oh.make_graph(
        [oh.make_node("Gather", ["W", "ids"], ["y"], name="lookup")],
        "big",
        [oh.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2])],
        [oh.make_tensor_value_info("y", FLOAT, [2, 8])],
        [tensor],
    )
    path = tmp_path / "big.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), str(path))
    assert os.path.getsize(path) < 10_000
    (y,) = onnx2jax.translate(str(path))(np.array([0, rows - 1], np.int64))
    np.testing.assert_array_equal(np.asarray(y), [np.ones(8), np.arange(8)])


def test_model_local_functions_are_inlined():
    """A FunctionProto of the model (as exporters emit for submodules) runs like its body."""
    body = [
        oh.make_node("MatMul", ["a", "b"], ["p"]),
        oh.make_node("Relu", ["p"], ["out"]),
    ]
    function = oh.make_function("local", "LinearRelu", ["a", "b"], ["out"], body, [oh.make_opsetid("", 17)])
    graph = oh.make_graph(
        [oh.make_node("LinearRelu", ["x", "W"], ["y"], domain="local", name="call")],
        "g",
        [oh.make_tensor_value_info("x", FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", FLOAT, [2, 3])],
        [onh.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) - 6, "W")],
    )
    model = oh.make_model(
        graph, functions=[function], opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("local", 1)]
    )
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) - 6
    (y,) = onnx2jax.translate(model)(x)
    np.testing.assert_allclose(np.asarray(y), np.maximum(x @ w, 0), rtol=1e-6)


def test_a_shape_computed_in_an_if_branch_folds_from_graph_inputs():
    # ConstantOfShape's shape is an If output whose branches compute it from the graph input 'n':
    # 'n' and the condition become compile-time values, and only the chosen branch runs.
    def branch(name, op):
        nodes = [oh.make_node("Identity", ["n"], [f"{name}_out"])] if op == "Identity" else [
            oh.make_node("Constant", [], [f"{name}_one"], value=onnx.numpy_helper.from_array(np.array([1], np.int64))),
            oh.make_node("Add", ["n", f"{name}_one"], [f"{name}_out"]),
        ]
        return oh.make_graph(nodes, name, [], [oh.make_empty_tensor_value_info(f"{name}_out")])

    graph = oh.make_graph(
        [
            oh.make_node("Constant", [], ["two"], value=onnx.numpy_helper.from_array(np.array([2], np.int64))),
            oh.make_node("Greater", ["n", "two"], ["big"]),
            oh.make_node("Squeeze", ["big"], ["cond"]),
            oh.make_node("If", ["cond"], ["shape"], then_branch=branch("then", "Identity"), else_branch=branch("else", "Add")),
            oh.make_node("ConstantOfShape", ["shape"], ["y"]),
        ],
        "g", [oh.make_tensor_value_info("n", onnx.TensorProto.INT64, [1])], [oh.make_empty_tensor_value_info("y")],
    )
    model = onnx2jax.translate(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=10))
    assert np.asarray(model(np.array([5], np.int64))[0]).shape == (5,)
    assert np.asarray(model(np.array([1], np.int64))[0]).shape == (2,)
