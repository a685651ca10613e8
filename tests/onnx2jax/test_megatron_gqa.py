"""Megatron TP 8 on a grouped-query Llama in the torch dynamo export's style (bench/medium_transformers.py).

The export builds each head Reshape's target at run time (``Concat(batch, seq,
[-1], [head_dim])``), so ONNX's shape inference leaves the head count symbolic
and only the head size is a constant. The plan must still find the heads of
q (16) and of k/v (4): split by features instead, k/v's 4 x 64 columns were cut
8 ways through the middle of each head, and compile refused the plan at
``q @ k^T`` (issue 21: the ~336M Llama of bench/real_size.py at TP 8). The
values are checked against onnxruntime, and the compiled program's collectives
are exactly Megatron's: one all-reduce per row-parallel linear and one for the
vocabulary-split embedding lookup.
"""

import dataclasses
import functools
import pathlib
import sys

import numpy as np
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding.annotate import name_nodes
from sharding.megatron import megatron_layout, megatron_plan

sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "bench"))
import medium_transformers as mt  # noqa: E402

# The real-size Llama's head layout (16 heads, 4 kv heads) at a tiny width: head size 8.
CONFIG = dataclasses.replace(mt.TINY, width=128, heads=16, kv_heads=4, layers=2)


@functools.lru_cache(maxsize=None)
def _model():
    model = mt.build("llama_gqa", CONFIG)
    name_nodes(model)  # the LM head's MatMul is unnamed, as the builder writes it
    return model


@pytest.mark.parametrize("gqa,kv_ways", [("replicate", 1), ("groups", 4)])
def test_plan_finds_query_and_key_value_heads_through_a_runtime_reshape_target(gqa, kv_ways):
    layout = megatron_layout(_model(), 8, gqa=gqa)
    heads = {lin.node: lin.heads for lin in layout.linears}
    attention = [p for p in layout.pairs if p.kind == "attention"]
    assert [p.ways for p in attention] == [8, 8]
    assert [p.column_ways for p in attention] == [(8, kv_ways, kv_ways)] * 2
    assert [heads[c] for p in attention for c in p.columns] == [16, 4, 4] * 2


def test_a_reshape_that_merges_leading_axes_gives_no_heads():
    # [batch, seq, 128] -> [-1, 8] with the head count symbolic: 8 is not known to be a head size (the Reshape
    # does not keep batch and seq), so the projection is split by features, as before.
    import onnx
    from onnx import TensorProto, helper

    from sharding.megatron.graph import PlanGraph
    from sharding.megatron.parts import feature_parts

    weight = onnx.numpy_helper.from_array(np.zeros((128, 128), np.float32), "w")
    target = onnx.numpy_helper.from_array(np.array([-1, 8], np.int64), "target")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
             helper.make_node("Reshape", ["y", "target"], ["z"], name="view")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 128])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [weight, target])
    plan_graph = PlanGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    assert plan_graph.shapes["z"][-1] == 8 and not isinstance(plan_graph.shapes["z"][0], int)
    assert feature_parts(plan_graph, "y", 128).heads is None


@functools.lru_cache(maxsize=None)
def _session():
    return ort.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("gqa", ["replicate", "groups"])
def test_tp8_equals_onnxruntime_with_megatrons_collectives(gqa):
    compiled = onnx2jax.compile(megatron_plan(_model(), 8, gqa=gqa))
    for batch, seq in [(1, 128), (2, 16)]:
        inputs = mt.inputs("llama_gqa", batch, seq, CONFIG)
        got = np.asarray(compiled(**inputs)[0])
        np.testing.assert_allclose(got, _session().run(None, inputs)[0], rtol=1e-5, atol=2e-6)
        counts = {k: v for k, v in count_collectives(compiled.compiled_text(**inputs)).items() if v}
        assert counts == {"all-reduce": 2 * 2 + 1}, (batch, seq)


def test_column_parallel_weights_are_read_in_place_on_every_call():
    # Each device's column product is a plain 2-D matmul of its slice; as a dot batched over the per-device stack
    # of x, XLA on CPU copied every column weight's slice, transposed, on every call (q [128, 16], gate/up
    # [128, 12] and the head [128, 32] here; 98 MB of temporaries per device on the 336M Llama).
    import re

    compiled = onnx2jax.compile(megatron_plan(_model(), 8))
    inputs = mt.inputs("llama_gqa", 1, 16, CONFIG)  # 16 tokens: no activation has the width's 128 and a slice's size
    text = compiled.compiled_text(**inputs)
    slices = {(16, 128), (12, 128), (32, 128)}
    moved = [
        m.group(0) for m in re.finditer(r"= f32\[([\d,]*)\]\{[^}]*\} (copy|transpose)\(", text)
        if tuple(sorted(int(d) for d in m.group(1).split(",") if int(d) > 1)) in slices
    ]
    assert moved == []
    np.testing.assert_allclose(np.asarray(compiled(**inputs)[0]), _session().run(None, inputs)[0], rtol=1e-5, atol=2e-6)
