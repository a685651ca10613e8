"""String ops on values known while tracing, against ONNX's reference evaluator.

JAX has no string dtype, so string tensors exist only as static values (string
initializers and what is computed from them); these tests feed them as initializers.
"""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import pytest
from onnx.reference import ReferenceEvaluator

from onnx2jax.ops import strings
from onnx2jax.translate import translate

T = onnx.TensorProto


def _reference(op, inputs, n_out=1, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    node = oh.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = oh.make_graph(
        [node], "g",
        [oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for n, v in zip(names, inputs)],
        [oh.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)], ir_version=10)
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))


def _same(actual, expected):
    actual = actual if isinstance(actual, tuple) else (actual,)
    for a, e in zip(actual, expected):
        assert np.asarray(a).shape == e.shape
        np.testing.assert_array_equal(np.asarray(a).astype(e.dtype), e)


def _s(*values):
    return np.array(values, dtype=object)


@pytest.mark.parametrize("x, y", [(_s("a", "bc"), _s("x", "yz")), (_s("a", "b"), _s("!")), (_s("ü"), _s(""))])
def test_string_concat(x, y):
    _same(strings.string_concat(x, y), _reference("StringConcat", [x, y]))


@pytest.mark.parametrize("attrs", [{}, {"delimiter": ","}, {"delimiter": ",", "maxsplit": 1}, {"delimiter": ""}])
def test_string_split(attrs):
    x = _s("a,b,,c", "hello  world ", "")
    _same(strings.string_split(x, **attrs), _reference("StringSplit", [x], n_out=2, **attrs))


@pytest.mark.parametrize("pattern", [r"\w+@\w+\.com", "a.*", ""])
def test_regex_full_match(pattern):
    x = _s("ab@cd.com", "abc", "", "a")
    _same(strings.regex_full_match(x, pattern=pattern), _reference("RegexFullMatch", [x], pattern=pattern))


@pytest.mark.parametrize(
    "attrs",
    [
        {"case_change_action": "LOWER", "stopwords": ["monday"], "is_case_sensitive": 0},
        {"case_change_action": "UPPER", "stopwords": ["monday"], "is_case_sensitive": 1},
        {"case_change_action": "NONE"},
        {"stopwords": ["monday", "tuesday"]},
    ],
)
@pytest.mark.parametrize("two_dim", [False, True])
def test_string_normalizer(attrs, two_dim):
    x = _s("monday", "tuesday", "Monday", "wednesday")
    if two_dim:
        x = x.reshape(1, -1)
    _same(strings.string_normalizer(x, **{"case_change_action": "NONE", "is_case_sensitive": 0, **attrs}), _reference("StringNormalizer", [x], **attrs))


def test_string_ops_fold_inside_a_model():
    # A string initializer flows through StringConcat into RegexFullMatch: all static, bool out.
    graph = oh.make_graph(
        [
            oh.make_node("StringConcat", ["s", "t"], ["c"]),
            oh.make_node("RegexFullMatch", ["c"], ["y"], pattern="a+b"),
        ],
        "g", [], [oh.make_tensor_value_info("y", T.BOOL, [3])],
        [onnx.numpy_helper.from_array(_s("a", "aa", "b"), "s"), onnx.numpy_helper.from_array(_s("b"), "t")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 20)], ir_version=10)
    np.testing.assert_array_equal(np.asarray(translate(model)()[0]), [True, True, False])


def test_traced_strings_are_refused():
    with pytest.raises(NotImplementedError, match="no string dtype"):
        strings.string_concat(object(), _s("a"))
