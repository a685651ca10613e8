"""ProgramPlan.at_shapes reads the written annotations once (sharding.written) and infers per call shape:
its inference and placements equal a fresh `sharding.infer` of the model at the same shapes, which reads
everything again (the reference), at a prefill's and a decode step's shapes of a sharded decoder."""

import pathlib

import pytest

import onnx2jax
from onnx2jax.runtime.placements import placements_on, spec_layouts
from sharding.infer import infer_graph
from sharding.mesh.mapping import map_specs
from sharding.stage_infer import infer
from sharding.written import read_annotations

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"


def _shapes(proto, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    return {
        i.name: tuple(dims[d.dim_param] if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim)
        for i in proto.graph.input
    }


def test_at_shapes_equals_a_fresh_inference_at_prefill_and_decode_shapes():
    plan = onnx2jax.load(GENAI / "llama_gqa_torch", devices=8).compiled.plan
    assert plan.annotations is not None and plan.annotations.by_index
    for dims in (
        {"batch_size": 2, "sequence_length": 7, "past_sequence_length": 0, "total_sequence_length": 7},
        {"batch_size": 2, "sequence_length": 1, "past_sequence_length": 9, "total_sequence_length": 10},
    ):
        dims["logit_positions"] = 1
        shapes = _shapes(plan.proto, dims)
        inference, placements = plan.at_shapes(shapes)
        fresh = infer(plan.proto, plan.configuration, input_shapes=shapes)
        layouts = spec_layouts(fresh, strict=True)
        mapping = map_specs(layouts, plan.mapping.plan.device_array().size, plan.mapping.plan)
        assert inference == fresh
        assert placements == placements_on(mapping, layouts, plan.mesh)
        assert inference.shapes["input_ids"] == (2, dims["sequence_length"])


def test_annotations_read_for_another_configuration_or_graph_are_refused():
    plan = onnx2jax.load(GENAI / "llama_gqa_torch", devices=2).compiled.plan
    other = read_annotations(plan.proto, "dp")
    with pytest.raises(ValueError, match="read for configuration 'dp'"):
        infer_graph(plan.proto, plan.configuration, annotations=other)
    fewer = read_annotations(plan.proto, plan.configuration)
    fewer = type(fewer)(fewer.configuration, fewer.order[:-1], fewer.by_index, fewer.diagnostics)
    with pytest.raises(ValueError, match=f"on {len(plan.proto.graph.node)} nodes"):
        infer_graph(plan.proto, plan.configuration, annotations=fewer)
