"""onnx2jax.input_checks against onnxruntime: the check refuses exactly the index values onnxruntime refuses.

Each model feeds a graph input (through value-keeping ops) into the indices of one
gather-like op over a table of known size; in-range values, negative ones counted
from the end, and values past either end are run through onnxruntime and through
the check, and the two must agree. The check is jax-free and is tested without jax.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from onnx2jax.errors import InputRangeError
from onnx2jax.input_checks import check, index_uses

TABLE = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return onnx.shape_inference.infer_shapes(model)


def _out(name="y"):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)


def _gather_via_cast():
    """int32 ids, Cast to int64 and Unsqueeze'd, index rows of an initializer table (an embedding)."""
    nodes = [
        helper.make_node("Cast", ["ids"], ["ids64"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["ids64", "zero"], ["ids2"]),
        helper.make_node("Gather", ["table", "ids2"], ["y"], name="embed"),
    ]
    inits = [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(np.array([0], np.int64), "zero")]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [2, 3])
    return _model(nodes, [ids], [_out()], inits), "ids", np.int32, (2, 3)


def _gather_axis1_computed_table():
    """Gather on axis 1 of a table computed in the graph (its shape from inference)."""
    nodes = [
        helper.make_node("Add", ["table", "table"], ["doubled"]),
        helper.make_node("Gather", ["doubled", "idx"], ["y"], name="cols", axis=1),
    ]
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [4])
    return _model(nodes, [idx], [_out()], [numpy_helper.from_array(TABLE, "table")]), "idx", np.int64, (4,)


def _gather_elements():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [2, 3])
    nodes = [helper.make_node("GatherElements", ["x", "idx"], ["y"], name="ge", axis=0)]
    return _model(nodes, [x, idx], [_out()]), "idx", np.int64, (2, 3)


def _gather_nd():
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [4, 2])
    nodes = [helper.make_node("GatherND", ["table", "idx"], ["y"], name="gnd")]
    return _model(nodes, [idx], [_out()], [numpy_helper.from_array(TABLE, "table")]), "idx", np.int64, (4, 2)


def _scatter_nd():
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 2])
    updates = numpy_helper.from_array(np.array([7.0], np.float32), "upd")
    nodes = [helper.make_node("ScatterND", ["table", "idx", "upd"], ["y"], name="snd")]
    return _model(nodes, [idx], [_out()], [numpy_helper.from_array(TABLE, "table"), updates]), "idx", np.int64, (1, 2)


MODELS = [_gather_via_cast, _gather_axis1_computed_table, _gather_elements, _gather_nd, _scatter_nd]


def _feeds(model: onnx.ModelProto, name: str, value: np.ndarray) -> dict[str, np.ndarray]:
    feeds = {name: value}
    for info in model.graph.input:
        if info.name != name:
            feeds[info.name] = np.zeros([d.dim_value for d in info.type.tensor_type.shape.dim], np.float32)
    return feeds


def _ort_refuses(model: onnx.ModelProto, feeds) -> bool:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    try:
        session.run(None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime's refusal is the reference
        return True
    return False


def _we_refuse(model: onnx.ModelProto, feeds) -> bool:
    try:
        check(index_uses(model), feeds)
    except InputRangeError:
        return True
    return False


@pytest.mark.parametrize("build", MODELS, ids=lambda b: b.__name__.strip("_"))
def test_refuses_exactly_what_onnxruntime_refuses(build):
    model, name, dtype, shape = build()
    assert index_uses(model), "the check finds the input that indexes the table"
    rng = np.random.default_rng(0)
    cases = [rng.integers(-3, 3, shape)]  # in range, negatives counted from the end
    for bad in (-7, -6, 5, 6, 999):
        value = rng.integers(0, 3, shape)
        value.flat[value.size // 2] = bad
        cases.append(value)
    refused = 0
    for value in cases:
        feeds = _feeds(model, name, value.astype(dtype))
        expected = _ort_refuses(model, feeds)
        assert _we_refuse(model, feeds) == expected, value
        refused += expected
    assert refused >= 4, "the out-of-range cases are refused by onnxruntime"


def test_error_names_input_position_value_and_bound():
    model, name, dtype, shape = _gather_via_cast()
    ids = np.zeros(shape, dtype)
    ids[1, 2] = 999
    with pytest.raises(InputRangeError) as raised:
        check(index_uses(model), {name: ids})
    error = raised.value
    assert (error.input, error.position, error.value, error.bound) == ("ids", (1, 2), 999, 5)
    assert (error.node, error.op, error.table) == ("embed", "Gather", "table")
    for part in ("'ids'", "[1, 2]", "999", "[-5, 5)", "'embed'", "check_indices=False"):
        assert part in str(error)


def test_gather_nd_names_the_coordinate():
    model, name, dtype, shape = _gather_nd()
    idx = np.zeros(shape, dtype)
    idx[3, 1] = 3  # the table's second axis has 3 entries
    with pytest.raises(InputRangeError) as raised:
        check(index_uses(model), {name: idx})
    assert (raised.value.position, raised.value.component, raised.value.bound) == ((3, 1), 1, 3)


def test_reshaped_coordinates_are_not_guessed():
    """A Reshape regroups GatherND's coordinate vectors: that path is left unchecked, never misread."""
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [8])
    nodes = [
        helper.make_node("Reshape", ["idx", "shape"], ["idx2"]),
        helper.make_node("GatherND", ["table", "idx2"], ["y"]),
    ]
    inits = [numpy_helper.from_array(TABLE, "table"), numpy_helper.from_array(np.array([4, 2], np.int64), "shape")]
    assert index_uses(_model(nodes, [idx], [_out()], inits)) == []


def test_unknown_table_size_and_tracers_are_skipped():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    idx = helper.make_tensor_value_info("idx", TensorProto.INT64, [2])
    model = _model([helper.make_node("Gather", ["x", "idx"], ["y"])], [x, idx], [_out()])
    assert index_uses(model) == []
    model, name, _, _ = _gather_via_cast()

    class Opaque:
        def __array__(self, *args, **kwargs):
            raise TypeError("not concrete")

    check(index_uses(model), {name: Opaque()})  # nothing to check, no failure


def test_no_jax():
    import subprocess
    import sys

    code = "import sys, onnx2jax.input_checks; assert 'jax' not in sys.modules, 'jax imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_index_check_binds_positional_and_named_arguments_and_can_be_disabled():
    from onnx2jax.input_checks import IndexCheck

    model, name, dtype, shape = _gather_via_cast()
    bad = np.full(shape, 5, dtype)
    checker = IndexCheck(model, [name])
    for inputs, named in (((bad,), {}), ((), {name: bad})):
        with pytest.raises(InputRangeError):
            checker.call(inputs, named)
    checker.call((np.zeros(shape, dtype),), {})
    checker.enabled = False
    checker.call((bad,), {})
