"""Shape and layout ops against onnxruntime, over the opsets they are registered for."""

import functools

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest

import opcheck
from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
_x = opcheck.normal_arrays(RNG)
_i = opcheck.int_values
# Static inputs (inits=) are initializers (shape inputs); outputs typed by ONNX shape inference
# (which tells translate about int64); results must match exactly.
check = functools.partial(opcheck.check, outputs="inferred", count="equal", compare="equal", trim=True)


@pytest.mark.parametrize("opset", [7, 13, 14, 21])
@pytest.mark.parametrize("shape", [(4, -1), (0, 3, -1), (-1,), (2, 0, 2, 2)])
def test_reshape(opset, shape):
    check("Reshape", opset, [_x(2, 3, 4), _i(*shape)], inits=(1,))


def test_reshape_allowzero():
    check("Reshape", 14, [_x(0, 3, 4), _i(3, 4, 0)], inits=(1,), allowzero=1)


@pytest.mark.parametrize("opset", [1, 13, 21])
@pytest.mark.parametrize("perm", [None, [0, 2, 1], [2, 0, 1]])
def test_transpose(opset, perm):
    attrs = {} if perm is None else {"perm": perm}
    check("Transpose", opset, [_x(2, 3, 4)], **attrs)


@pytest.mark.parametrize("axes", [None, [1], [-1, 1]])
def test_squeeze(axes):
    x = _x(2, 1, 3, 1)
    check("Squeeze", 11, [x], **({} if axes is None else {"axes": axes}))
    check("Squeeze", 13, [x, None if axes is None else _i(*axes)], inits=(1,))


@pytest.mark.parametrize("axes", [[0], [1, -1], [3, 0]])
def test_unsqueeze(axes):
    x = _x(2, 3)
    check("Unsqueeze", 11, [x], axes=axes)
    check("Unsqueeze", 21, [x, _i(*axes)], inits=(1,))


@pytest.mark.parametrize("opset", [9, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, 3, -1])
def test_flatten(opset, axis):
    if axis < 0 and opset < 11:
        pytest.skip("negative axes since opset 11")
    check("Flatten", opset, [_x(2, 3, 4, 5)], axis=axis)


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -3, "end": 2}, {"start": 5}])
def test_shape(attrs):
    check("Shape", 15 if attrs else 13, [_x(2, 3, 4)], **attrs)


def test_size():
    check("Size", 13, [_x(2, 3, 4)])


@pytest.mark.parametrize("shape", [(3, 1), (2, 1, 1), (1,), (3, 4)])
def test_expand(shape):
    check("Expand", 13, [_x(3, 1), _i(*shape)], inits=(1,))


@pytest.mark.parametrize("repeats", [(1, 1), (2, 3), (3, 0)])
def test_tile(repeats):
    check("Tile", 13, [_x(2, 3), _i(*repeats)], inits=(1,))


@pytest.mark.parametrize("opset", [4, 11, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(opset, axis):
    if axis < 0 and opset < 11:
        pytest.skip("negative axes since opset 11")
    check("Concat", opset, [_x(2, 2), _x(2, 2), _x(2, 2)], axis=axis)


@pytest.mark.parametrize("opset,attrs,arrays,n_out", [
    (11, {"axis": 1}, [_x(2, 6)], 3),
    (11, {"axis": 0, "split": [1, 3]}, [_x(4, 2)], 2),
    (13, {"axis": -1}, [_x(2, 6), _i(2, 4)], 2),
    (13, {}, [_x(6, 2)], 2),
    (18, {"axis": 1, "num_outputs": 3}, [_x(2, 7)], 3),
    (18, {"axis": 0}, [_x(5, 2), _i(2, 0, 3)], 3),
])
def test_split(opset, attrs, arrays, n_out):
    check("Split", opset, arrays, inits=(1,), n_out=n_out, **attrs)


SLICES = [
    ([0, 1], [2, 3], None, None),
    ([1], [-1], [1], None),
    ([-1, 0], [-1000, 10], [0, 1], [-1, 2]),
    ([10], [-10], [-1], [-2]),
    ([0], [2**62], [2], None),
    ([3], [0], [0], [-1]),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    arrays = [_x(4, 5, 3), _i(*starts), _i(*ends), None if axes is None else _i(*axes), None if steps is None else _i(*steps)]
    check("Slice", 13, arrays, inits=(1, 2, 3, 4))
    if steps is None and (axes is None or min(axes) >= 0):
        check("Slice", 1, [arrays[0]], starts=starts, ends=ends, **({} if axes is None else {"axes": axes}))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = _x(3, 4)
    pads = _i(1, 2, 2, 1)
    check("Pad", 19, [x, pads, np.asarray(1.5, np.float32), None], inits=(1, 3), mode=mode)
    check("Pad", 19, [x, _i(2, 1), None, _i(-1)], inits=(1, 3), mode=mode)
    if mode != "wrap":
        check("Pad", 13, [x, pads], inits=(1,), mode=mode)
        check("Pad", 2, [x], pads=[1, 2, 2, 1], mode=mode, value=0.5)


def test_pad_negative_crops():
    check("Pad", 18, [_x(4, 5), _i(-1, 2, 1, -2), np.asarray(3.0, np.float32)], inits=(1,))


def test_pad_int_constant():
    check("Pad", 18, [np.arange(6, dtype=np.int32).reshape(2, 3), _i(0, 1, 1, 0), np.asarray(7, np.int32)], inits=(1,))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    check("DepthToSpace", 13, [_x(2, 8, 3, 2)], blocksize=2, mode=mode)


def test_depth_to_space_opset1():
    check("DepthToSpace", 1, [_x(1, 18, 2, 2)], blocksize=3)


def test_space_to_depth():
    check("SpaceToDepth", 13, [_x(2, 3, 4, 6)], blocksize=2)


def test_identity():
    check("Identity", 21, [_x(2, 3)])
    check("Identity", 13, [_i(1, 2)])


def test_center_crop_pad_matches_the_reference():
    from onnx.reference import ReferenceEvaluator

    x = _x(5, 4, 3)
    for shape, axes in [((3, 6), (0, 1)), ((7,), (-1,)), ((4, 4, 4), None)]:
        attrs = {} if axes is None else {"axes": list(axes)}
        model, _ = opcheck.single_node_model(
            "CenterCropPad", 18, [x, _i(*shape)], inits=(1,), infer_shapes=True, trim=True, **attrs
        )
        (expected,) = ReferenceEvaluator(model).run(None, {"x0": x})
        (actual,) = translate(model)(x)
        np.testing.assert_array_equal(np.asarray(actual), expected)


def test_transformer_shape_chain_folds_under_jit():
    # Shape -> Gather -> Unsqueeze -> Concat -> Reshape, as torch.onnx exports for
    # x.view(batch, seq, heads, -1): must fold while tracing, with dynamic dims.
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        oh.make_node("Gather", ["s", "one"], ["t"], axis=0),
        oh.make_node("Unsqueeze", ["b", "ax"], ["b1"]),
        oh.make_node("Unsqueeze", ["t", "ax"], ["t1"]),
        oh.make_node("Concat", ["b1", "t1", "heads"], ["shape"], axis=0),
        oh.make_node("Reshape", ["x", "shape"], ["y"]),
        oh.make_node("Slice", ["y", "zero1", "seq_end", "one1"], ["z"]),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.asarray(0, np.int64), "zero"),
        onnx.numpy_helper.from_array(np.asarray(1, np.int64), "one"),
        onnx.numpy_helper.from_array(_i(0), "ax"),
        onnx.numpy_helper.from_array(_i(2, -1), "heads"),
        onnx.numpy_helper.from_array(_i(0), "zero1"),
        onnx.numpy_helper.from_array(_i(1), "one1"),
    ]
    graph = oh.make_graph(
        [*nodes[:-1], oh.make_node("Shape", ["x"], ["seq_end"], start=1, end=2), nodes[-1]],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", "seq", 8])],
        [oh.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    model = translate(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10))
    for shape in [(1, 3, 8), (2, 5, 8)]:
        x = _x(*shape)
        (z,) = model(x)
        np.testing.assert_array_equal(np.asarray(z), x.reshape(shape[0], shape[1], 2, 4))
    with jax.enable_x64(True):
        jaxpr = jax.make_jaxpr(lambda x: model.fn(model.params, x))(_x(2, 5, 8))
    assert {e.primitive.name for e in jaxpr.jaxpr.eqns} <= {"reshape", "slice"}
