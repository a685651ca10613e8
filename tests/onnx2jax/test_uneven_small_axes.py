"""A small axis split over more shards than it has elements (a length-2 tensor over 4 shards), on a graph input, an
intermediate and an output: right at the first call, never jax's IndivisibleError, with and without the persistent
compilation cache (issue 33, item 8). Reference: onnxruntime. Placement as documented (docs/sharding.md, "Uneven
shards"): an input JAX cannot hold moves replicated and is cut inside the program; an output comes back split on
another axis its mesh axes divide, or replicated, with a warning naming it.
"""

from __future__ import annotations

import warnings

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime as ort
import pytest

import onnx2jax
from sharding.annotate import add_configuration, set_spec
from sharding.text import parse_spec

FOUR = "@ [0,1,2,3]"


def _model(specs: dict[tuple[str, str], str]) -> onnx.ModelProto:
    """x [2, 6] -> Relu (r) -> Slice rows 0:2 of cat(r, r) (s [2, 6]) -> Tanh (y [2, 6]); specs by (node, tensor)."""
    starts, ends, axes = (oh.make_tensor(n, onnx.TensorProto.INT64, [1], [v]) for n, v in (("st", 0), ("en", 2), ("ax", 0)))
    graph = oh.make_graph(
        [
            oh.make_node("Relu", ["x"], ["r"], name="relu"),
            oh.make_node("Concat", ["r", "r"], ["c"], name="cat", axis=0),
            oh.make_node("Slice", ["c", "st", "en", "ax"], ["s"], name="slice"),
            oh.make_node("Tanh", ["s"], ["y"], name="tanh"),
        ],
        "small", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 6])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6])], [starts, ends, axes],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    add_configuration(model, "tp", 4)
    for (node, tensor), text in specs.items():
        set_spec(model, node, parse_spec(text, tensor_name=tensor))
    return model


CASES = {
    "input": {("relu", "x"): f"0:4 {FOUR}"},
    "intermediate": {("slice", "s"): f"0:4 {FOUR}", ("tanh", "s"): f"0:4 {FOUR}"},
    "output": {("tanh", "y"): f"0:4 {FOUR}"},
    "all": {("relu", "x"): f"0:4 {FOUR}", ("relu", "r"): f"0:4 {FOUR}", ("slice", "s"): f"0:4 {FOUR}",
            ("tanh", "y"): f"0:4 {FOUR}"},
}


@pytest.mark.parametrize("case", CASES)
def test_a_length_2_axis_over_4_shards_runs_right_at_the_first_call(case, tmp_path):
    model = _model(CASES[case])
    x = np.random.default_rng(0).normal(size=(2, 6)).astype(np.float32)
    (expected,) = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for cache in (False, True):
        if cache:
            from onnx2jax.runtime import compilation_cache

            compilation_cache.enable(str(tmp_path / "xla"))  # conftest turns it off after the test
            jax.clear_caches()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (y,) = onnx2jax.compile(model)(x)
        np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-6, atol=1e-6)
        if ("tanh", "y") in CASES[case]:  # 6 columns split in 4 neither: replicated, and said
            assert y.sharding.is_fully_replicated
            assert any("output 'y' [2, 6]" in str(w.message) and "comes back replicated" in str(w.message) for w in caught)
