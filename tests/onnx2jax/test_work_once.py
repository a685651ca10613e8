"""Work a compile does once (issue 19): whole-model shape inference once per compile, each (sub-)model
translated once, and sharding inference once per model or segment and per call-shape signature.

Counted by wrapping ``onnx.shape_inference.infer_shapes``, ``JaxModel.__init__`` and ``sharding.infer`` where
the runtime calls it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference
import pytest

import onnx2jax
import onnx2jax.runtime.plan
import sharding.segment_sharding
from onnx2jax.translate import JaxModel
from sharding.annotate import add_configuration, set_stage
from sharding.megatron.plan import megatron_plan
from sharding.stages import auto_stages
from test_segments_sharded import nonzero_then_matmul

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"


@pytest.fixture
def counts(monkeypatch) -> dict:
    """Calls so far: ``shape inference`` (node counts of the models inferred), ``translate``, ``infer``."""
    found: dict = {"shape inference": [], "translate": 0, "infer": 0}
    infer_shapes, init, infer = onnx.shape_inference.infer_shapes, JaxModel.__init__, sharding.segment_sharding.infer

    def counted_infer_shapes(model, *args, **kwargs):
        found["shape inference"].append(len(model.graph.node))
        return infer_shapes(model, *args, **kwargs)

    def counted_init(self, *args, **kwargs):
        found["translate"] += 1
        init(self, *args, **kwargs)

    def counted_infer(*args, **kwargs):
        found["infer"] += 1
        return infer(*args, **kwargs)

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted_infer_shapes)
    monkeypatch.setattr(JaxModel, "__init__", counted_init)
    for module in (onnx2jax.runtime.plan, sharding.segment_sharding):  # the runtime's callers of sharding.infer
        monkeypatch.setattr(module, "infer", counted_infer)
    return found


def _reset(counts: dict) -> None:
    counts.update({"shape inference": [], "translate": 0, "infer": 0})


def test_a_megatron_compile_infers_shapes_once_and_specs_once_per_call_shape(counts) -> None:
    model = megatron_plan(onnx.load(LLAMA), 8)
    _reset(counts)
    compiled = onnx2jax.compile(model)
    assert counts == {"shape inference": [len(model.graph.node)], "translate": 1, "infer": 1}
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    _reset(counts)
    compiled(ids)
    compiled(ids)
    compiled.report(ids)
    assert counts["infer"] <= 1 and counts["translate"] == 0  # once at this call-shape signature (or none)
    infers = counts["infer"]
    compiled(np.concatenate([ids, ids]))
    assert counts["infer"] == infers + 1  # a new signature: once more


def test_a_pipeline_compile_infers_the_whole_model_once(counts) -> None:
    model = onnx.load(LLAMA)
    stage_of, _ = auto_stages(model, 2)
    add_configuration(model, "pp", 2)
    for node, stage in stage_of.items():
        set_stage(model, node, stage, "pp")
    _reset(counts)
    compiled = onnx2jax.compile(model, microbatches=2)
    assert counts["shape inference"] == [len(model.graph.node)]  # the stages' inputs typed from it
    assert counts["translate"] == len(compiled.stages) == 2


def test_a_segmented_model_is_translated_once_and_each_segment_inferred_once(counts) -> None:
    model = nonzero_then_matmul()
    _reset(counts)
    compiled = onnx2jax.compile(model)
    jitted = [s for s in compiled.segments if s.kind == "jit"]
    whole = [n for n in counts["shape inference"] if n == len(model.graph.node)]
    assert whole == [len(model.graph.node)]
    assert counts["translate"] == 1 + len(jitted)  # the model, and its jitted segments' sub-models within it
    assert counts["infer"] == len(jitted)
    assert [p.model for p in compiled.programs if p is not None] == [m for m in compiled.model.segment_models if m]
