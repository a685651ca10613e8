"""LabelEncoder, CategoryMapper, OneHotEncoder, ZipMap (ai.onnx.ml) against onnxruntime.

String inputs are compile-time constants (JAX has no strings); numeric inputs are traced,
and strings chosen by them come back from the host (onnx2jax.hostvalues).
"""

import functools

import numpy as np
import onnxruntime as ort
import pytest

from onnx2jax.errors import NodeError
from onnx2jax.translate import translate
from tests.onnx2jax.ops import opcheck

ML = "ai.onnx.ml"
check = functools.partial(opcheck.check, domain=ML, ai_onnx_opset=19, compare="equal")
STRINGS = np.array([["a", "zz"], ["c", "b"]], dtype=object)
INTS = np.array([[3, 1], [7, 2]], dtype=np.int64)


def _both(op, opset, x, n_out=1, **attrs):
    """onnx2jax's and onnxruntime's outputs (lists) for one node."""
    model, feeds = opcheck.single_node_model(op, opset, [x], n_out=n_out, domain=ML, ai_onnx_opset=19, **attrs)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return list(translate(model)(*feeds.values())), expected


def _same_strings(op, opset, x, **attrs):
    (got,), (expected,) = _both(op, opset, x, **attrs)
    assert got.dtype == object and got.shape == expected.shape and got.tolist() == expected.tolist()


def test_label_encoder_string_to_int():
    check("LabelEncoder", 2, [STRINGS], keys_strings=["a", "b", "c"], values_int64s=[10, 11, 12], default_int64=-5)


def test_label_encoder_int_to_float_traced():
    check("LabelEncoder", 2, [INTS], keys_int64s=[1, 7], values_floats=[0.5, 1.5], default_float=9.0)


def test_label_encoder_float_nan_key():
    x = np.array([1.0, np.nan, 2.0], np.float32)
    check("LabelEncoder", 4, [x], keys_floats=[np.nan, 2.0], values_int64s=[4, 5])


def test_label_encoder_int_to_string_traced():
    _same_strings("LabelEncoder", 2, INTS, keys_int64s=[1, 7], values_strings=["one", "seven"], default_string="?")


def test_category_mapper_both_ways():
    check("CategoryMapper", 1, [STRINGS], cats_strings=["a", "b", "c"], cats_int64s=[1, 2, 3], default_int64=0)
    _same_strings("CategoryMapper", 1, INTS, cats_strings=["a", "b", "c"], cats_int64s=[1, 2, 3], default_string="??")


@pytest.mark.parametrize("x, cats", [(INTS, {"cats_int64s": [1, 2, 3, 7]}), (STRINGS, {"cats_strings": ["a", "b", "c", "zz"]})])
def test_one_hot_encoder(x, cats):
    check("OneHotEncoder", 1, [x], zeros=0, **cats)
    check("OneHotEncoder", 1, [x], zeros=1, **{k: v[1:] for k, v in cats.items()})


def test_one_hot_encoder_unknown_with_zeros_0_is_an_error():
    model, feeds = opcheck.single_node_model("OneHotEncoder", 1, [INTS], domain=ML, ai_onnx_opset=19, cats_int64s=[1, 2], zeros=0)
    with pytest.raises(Exception, match="not one of the categories"):
        translate(model)(*feeds.values())


@pytest.mark.parametrize("labels", [{"classlabels_int64s": [4, 9]}, {"classlabels_strings": ["no", "yes"]}])
def test_zip_map(labels):
    probabilities = np.array([[0.25, 0.75], [1.0, 0.0], [0.5, 0.5]], np.float32)
    (got,), (expected,) = _both("ZipMap", 1, probabilities, **labels)
    assert isinstance(got, list) and got == expected


def test_run_time_strings_cannot_feed_other_ops():
    import onnx.helper as oh

    graph = oh.make_graph(
        [oh.make_node("CategoryMapper", ["x"], ["s"], domain=ML, cats_strings=["a"], cats_int64s=[1]),
         oh.make_node("StringNormalizer", ["s"], ["y"], name="norm", case_change_action="UPPER")],
        "g", [oh.make_tensor_value_info("x", 7, [2])], [oh.make_empty_tensor_value_info("y")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19), oh.make_opsetid(ML, 3)], ir_version=10)
    with pytest.raises(NodeError, match="'norm'.*chosen at run time.*only a graph output or Identity"):
        translate(model)(np.array([1, 2], np.int64))
