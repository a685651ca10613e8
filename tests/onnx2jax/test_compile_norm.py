"""A normalisation over a split axis compiles to the fewer bytes of two ways (issue 23).

x [B, S, 16] -> column MatMul (weight split on N: the output's hidden axis split 8 ways)
-> LayerNorm / RMSNorm / Softmax over that hidden axis -> y. Either the normalised
output comes out whole, and then one all-gather of the input before the norm is the
minimum (XLA alone computed the statistics as partial sums, two all-reduces, and then
gathered the output anyway); or the output is written split on the normalised axis,
and then the statistics' all-reduces ([B, S, 1] each) are the minimum and nothing is
gathered. Values against onnxruntime.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding import check
from sharding.annotate import add_configuration, set_spec
from sharding.spec import ShardingSpec

N, H = 8, 16
RNG = np.random.default_rng(0)


def _model(op: str, split_output: bool) -> onnx.ModelProto:
    norm_inputs = {"LayerNormalization": ["h", "scale", "bias"], "RMSNormalization": ["h", "scale"],
                   "Softmax": ["h"]}[op]
    attrs = {"axis": -1}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="proj"),
        helper.make_node(op, norm_inputs, ["y"], name="norm", **attrs),
    ]
    inits = [
        numpy_helper.from_array((RNG.standard_normal((H, H)) * 0.3).astype(np.float32), "w"),
        numpy_helper.from_array(RNG.uniform(0.5, 1.5, H).astype(np.float32), "scale"),
        numpy_helper.from_array(RNG.standard_normal(H).astype(np.float32) * 0.1, "bias"),
    ]
    inits = [i for i in inits if i.name in ("w", *norm_inputs)]
    graph = helper.make_graph(
        nodes, "norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", H])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    add_configuration(model, "tp", N)
    devices = range(N)
    set_spec(model, "proj", ShardingSpec.split("w", {1: N}, devices), "tp")
    set_spec(model, "proj", ShardingSpec.split("h", {2: N}, devices), "tp")
    if split_output:
        set_spec(model, "norm", ShardingSpec.split("y", {2: N}, devices), "tp")
    return model


@pytest.mark.parametrize(
    "op, split_output, minimum",
    [
        ("LayerNormalization", False, (0, 1)),  # one gather of the input, then local
        ("RMSNormalization", False, (0, 1)),
        ("Softmax", False, (0, 1)),
        ("LayerNormalization", True, (2, 0)),  # mean and variance as partial sums, no gather
        ("RMSNormalization", True, (1, 0)),  # the mean square
        ("Softmax", True, (2, 0)),  # the max and the sum
    ],
)
def test_a_norm_over_a_split_axis_costs_the_cheaper_way(op, split_output, minimum):
    model = _model(op, split_output)
    x = RNG.standard_normal((2, 5, H)).astype(np.float32)
    compiled = onnx2jax.compile(model)
    (y,) = compiled(x)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5)
    counts = count_collectives(compiled.compiled_text(x))
    others = {k: v for k, v in counts.items() if k not in ("all-reduce", "all-gather") and v}
    assert (counts["all-reduce"], counts["all-gather"], others) == (*minimum, {})
    # Prediction = program: inference predicts these very collectives at the norm node.
    predicted = [(d.code, d.expected) for d in check(model, input_shapes={"x": x.shape})
                 if d.code in ("collective", "reshard") and d.node == "norm"]
    assert predicted == [("collective", "all-reduce" if split_output else "all-gather")] * sum(minimum)
    assert not [n for n in compiled.report(x).notes if n.startswith(("XLA added", "inference predicted"))]
