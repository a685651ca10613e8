"""NonMaxSuppression on constant inputs against onnxruntime; traced boxes are a clear error."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)


def _inputs(center):
    xy = RNG.uniform(0, 10, (2, 12, 2))
    wh = RNG.uniform(1, 4, (2, 12, 2))
    boxes = np.concatenate([xy, wh], -1) if center else np.concatenate([xy, xy + wh], -1)
    return {
        "boxes": boxes.astype(np.float32),
        "scores": RNG.uniform(0, 1, (2, 3, 12)).astype(np.float32),
        "max_out": np.array([4], np.int64),
        "iou": np.array([0.3], np.float32),
        "score": np.array([0.2], np.float32),
    }


@pytest.mark.parametrize("opset", [10, 11])
@pytest.mark.parametrize("center", [0, 1])
def test_nms_on_constants(opset, center):
    values = _inputs(center)
    consts = [oh.make_node("Constant", [], [n], value=onh.from_array(v, n)) for n, v in values.items()]
    node = oh.make_node("NonMaxSuppression", list(values), ["selected"], center_point_box=center)
    graph = oh.make_graph(consts + [node], "g", [], [oh.make_tensor_value_info("selected", onnx.TensorProto.INT64, None)])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], ir_version=10)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {})
    (actual,) = translate(model)()
    actual = np.asarray(actual)
    assert actual.dtype == np.int64 and actual.shape == expected.shape
    np.testing.assert_array_equal(actual, expected)


def test_nms_on_runtime_boxes_runs_on_the_host():
    values = _inputs(0)
    node = oh.make_node("NonMaxSuppression", ["boxes", "scores"], ["selected"], name="nms")
    graph = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, values[n].shape) for n in ("boxes", "scores")],
        [oh.make_tensor_value_info("selected", onnx.TensorProto.INT64, None)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 11)], ir_version=10)
    translated = translate(model)
    assert [s.kind for s in translated.segments] == ["host"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"boxes": values["boxes"], "scores": values["scores"]})
    (actual,) = translated(values["boxes"], values["scores"])
    np.testing.assert_array_equal(np.asarray(actual), expected)
