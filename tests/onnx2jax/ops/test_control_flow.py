"""If, Loop and Scan against onnxruntime: static and traced conditions and trip counts."""

import functools

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

import opcheck
from onnx2jax.errors import NodeError
from onnx2jax.translate import translate

F, I64, B = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.BOOL
RNG = np.random.default_rng(0)


def _vi(name, dtype, shape=None):
    return oh.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, opset, inits=()):
    graph = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)


_check = functools.partial(opcheck.check_model, rtol=1e-5, atol=1e-6, count="equal")


def _branch(name, node):
    return oh.make_graph([node], name, [], [_vi(node.output[0], F, None)])


@pytest.mark.parametrize("opset", [11, 16, 21])
@pytest.mark.parametrize("cond", [True, False])
def test_if_traced_condition(opset, cond):
    then_g = _branch("then", oh.make_node("Add", ["x", "x"], ["t"]))
    else_g = _branch("else", oh.make_node("Mul", ["x", "x"], ["e"]))
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    model = _model([node], [_vi("c", B, []), _vi("x", F, [2, 3])], [_vi("y", F, [2, 3])], opset)
    _check(model, {"c": np.array(cond), "x": RNG.standard_normal((2, 3)).astype(np.float32)})


@pytest.mark.parametrize("cond", [True, False])
def test_if_static_condition_allows_different_shapes(cond):
    then_g = _branch("then", oh.make_node("Concat", ["x", "x"], ["t"], axis=0))
    else_g = _branch("else", oh.make_node("Identity", ["x"], ["e"]))
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    model = _model(
        [node], [_vi("x", F, [2, 3])], [_vi("y", F, None)], 13, [onh.from_array(np.array(cond), "c")]
    )
    _check(model, {"x": RNG.standard_normal((2, 3)).astype(np.float32)})


@pytest.mark.parametrize("cond", [True, False])
def test_if_traced_condition_with_branches_of_different_shapes(cond):
    # One XLA program cannot hold it: the model runs segmented (tests/onnx2jax/test_if_segments.py),
    # and its traced function names the If.
    import jax

    then_g = _branch("then", oh.make_node("Concat", ["x", "x"], ["t"], axis=0))
    else_g = _branch("else", oh.make_node("Identity", ["x"], ["e"]))
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branchy")
    model = _model([node], [_vi("c", B, []), _vi("x", F, [2, 3])], [_vi("y", F, None)], 13)
    _check(model, {"c": np.array(cond), "x": RNG.standard_normal((2, 3)).astype(np.float32)})
    translated = translate(model)
    with pytest.raises(NodeError, match=r"'branchy'.*(different shapes|both branches must produce the same)"):
        jax.jit(translated.fn)(translated.params, np.array(cond), np.zeros((2, 3), np.float32))


def _accumulate_body():
    """y_out = y_in + x[iter] (a Slice on the iteration number), scan output y_out; cond passes through."""
    nodes = [
        oh.make_node("Identity", ["cond_in"], ["cond_out"]),
        oh.make_node("Add", ["iter", "one"], ["end"]),
        oh.make_node("Unsqueeze", ["iter", "zero"], ["start1"]),
        oh.make_node("Unsqueeze", ["end", "zero"], ["end1"]),
        oh.make_node("Slice", ["table", "start1", "end1"], ["row"]),
        oh.make_node("Add", ["y_in", "row"], ["y_out"]),
        oh.make_node("Identity", ["y_out"], ["scan_out"]),
    ]
    inits = [onh.from_array(np.array(1, np.int64), "one"), onh.from_array(np.array([0], np.int64), "zero")]
    return oh.make_graph(
        nodes,
        "body",
        [_vi("iter", I64, []), _vi("cond_in", B, []), _vi("y_in", F, [1])],
        [_vi("cond_out", B, []), _vi("y_out", F, [1]), _vi("scan_out", F, [1])],
        inits,
    )


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("trip", [0, 1, 4])
def test_loop_static_trip_count_with_scan_outputs(opset, trip):
    node = oh.make_node("Loop", ["M", "cond", "y0"], ["y", "ys"], body=_accumulate_body())
    table = RNG.standard_normal(5).astype(np.float32)
    inits = [onh.from_array(np.array(trip, np.int64), "M"), onh.from_array(np.array(True), "cond")]
    model = _model(
        [oh.make_node("Constant", [], ["table"], value=onh.from_array(table))] + [node],
        [_vi("y0", F, [1])],
        [_vi("y", F, [1]), _vi("ys", F, None)],
        opset,
        inits,
    )
    _check(model, {"y0": np.array([0.5], np.float32)})


def _doubling_body(with_scan: bool):
    """x_out = 2 * x_in; keep going while x_out < limit (a condition on a loop-carried value)."""
    nodes = [
        oh.make_node("Add", ["x_in", "x_in"], ["x_out"]),
        oh.make_node("Less", ["x_out", "limit"], ["cond_out"]),
    ]
    outputs = [_vi("cond_out", B, []), _vi("x_out", F, [])]
    if with_scan:
        nodes.append(oh.make_node("Identity", ["x_out"], ["s"]))
        outputs.append(_vi("s", F, []))
    return oh.make_graph(nodes, "body", [_vi("i", I64, []), _vi("cond_in", B, []), _vi("x_in", F, [])], outputs)


@pytest.mark.parametrize("x0", [0.3, 5.0, 200.0])
def test_loop_data_dependent_condition_runs_a_while_loop(x0):
    node = oh.make_node("Loop", ["M", "", "x0"], ["x"], body=_doubling_body(False))
    model = _model(
        [node], [_vi("x0", F, []), _vi("limit", F, [])], [_vi("x", F, [])], 13,
        [onh.from_array(np.array(50, np.int64), "M")],
    )
    _check(model, {"x0": np.array(x0, np.float32), "limit": np.array(100.0, np.float32)})


def test_loop_runtime_trip_count_without_scan_outputs():
    body = oh.make_graph(
        [oh.make_node("Identity", ["cond_in"], ["cond_out"]), oh.make_node("Add", ["x_in", "step"], ["x_out"])],
        "body",
        [_vi("i", I64, []), _vi("cond_in", B, []), _vi("x_in", F, [3])],
        [_vi("cond_out", B, []), _vi("x_out", F, [3])],
    )
    node = oh.make_node("Loop", ["M", "c", "x0"], ["x"], body=body)
    model = _model(
        [node],
        [_vi("M", I64, []), _vi("c", B, []), _vi("x0", F, [3]), _vi("step", F, [3])],
        [_vi("x", F, [3])],
        16,
    )
    step = RNG.standard_normal(3).astype(np.float32)
    for m in (0, 3):
        _check(model, {"M": np.array(m, np.int64), "c": np.array(True), "x0": np.zeros(3, np.float32), "step": step})


def test_loop_scan_outputs_need_a_static_trip_count():
    node = oh.make_node("Loop", ["M", "", "x0"], ["x", "xs"], body=_doubling_body(True), name="grow")
    model = _model(
        [node], [_vi("x0", F, []), _vi("limit", F, [])], [_vi("x", F, []), _vi("xs", F, None)], 13,
        [onh.from_array(np.array(50, np.int64), "M")],
    )
    with pytest.raises(NodeError, match=r"'grow'.*scan output.*trip count is only known at run time"):
        translate(model)(np.array(1.0, np.float32), np.array(100.0, np.float32))


def _scan_body():
    nodes = [
        oh.make_node("Add", ["s_in", "a"], ["s_out"]),
        oh.make_node("Mul", ["s_out", "b"], ["y"]),
    ]
    return oh.make_graph(
        nodes, "body", [_vi("s_in", F, [3]), _vi("a", F, [3]), _vi("b", F, [3])], [_vi("s_out", F, [3]), _vi("y", F, [3])]
    )


@pytest.mark.parametrize("opset", [9, 21])
@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"scan_input_directions": [1, 0], "scan_output_directions": [1]},
        {"scan_input_axes": [1, -1], "scan_output_axes": [1]},
        {"scan_input_axes": [0, 1], "scan_input_directions": [0, 1], "scan_output_axes": [-1]},
    ],
)
def test_scan(opset, attrs):
    axes = attrs.get("scan_input_axes", [0, 0])
    shapes = [[4, 3] if ax == 0 else [3, 4] for ax in axes]
    node = oh.make_node("Scan", ["s0", "a", "b"], ["s", "ys"], body=_scan_body(), num_scan_inputs=2, **attrs)
    model = _model(
        [node],
        [_vi("s0", F, [3]), _vi("a", F, shapes[0]), _vi("b", F, shapes[1])],
        [_vi("s", F, [3]), _vi("ys", F, None)],
        opset,
    )
    feeds = {
        "s0": RNG.standard_normal(3).astype(np.float32),
        "a": RNG.standard_normal(shapes[0]).astype(np.float32),
        "b": RNG.standard_normal(shapes[1]).astype(np.float32),
    }
    _check(model, feeds)


@pytest.mark.parametrize("directions,lens", [([0, 0], None), ([1, 0], None), ([0, 0], [4, 2]), ([1, 0], [3, 1])])
def test_scan_8_batched(directions, lens):
    node = oh.make_node(
        "Scan", ["lens" if lens else "", "s0", "a", "b"], ["s", "ys"], body=_scan_body(), num_scan_inputs=2,
        directions=directions,
    )
    inputs = [_vi("s0", F, [2, 3]), _vi("a", F, [2, 4, 3]), _vi("b", F, [2, 4, 3])]
    feeds = {
        "s0": RNG.standard_normal((2, 3)).astype(np.float32),
        "a": RNG.standard_normal((2, 4, 3)).astype(np.float32),
        "b": RNG.standard_normal((2, 4, 3)).astype(np.float32),
    }
    if lens:
        inputs.append(_vi("lens", I64, [2]))
        feeds["lens"] = np.array(lens, np.int64)
    model = _model([node], inputs, [_vi("s", F, [2, 3]), _vi("ys", F, None)], 8)
    _check(model, feeds)
