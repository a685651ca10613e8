"""jax.export with a symbolic batch (issue 22): shape chains carry jax's ``DimExpr`` (onnx2jax/symbolic.py).

One artifact, exported once with ``batch`` symbolic, is called at several
batch sizes and compared with onnxruntime (the independent reference) and
with the compiled model at that size, whose shardings it must keep:

- the zoo (LMs, encoders, T5, vision and audio models) and the BERT fixture,
  unsharded and under ``megatron_plan(model, TP)``;
- a graph of the shape ops a torch export chains (Shape, Gather, Unsqueeze,
  Concat, Reshape with 0 and -1, Expand, ConstantOfShape, Range, Slice, Size,
  arithmetic, Max, Cast of a size to float);
- data x tensor parallel, whose spec splits the symbolic batch itself: the
  split is kept, batch 2 comes back split and an uneven batch (3) is still right;
- a comparison that depends on the batch's value is refused, naming the node;
- batch and sequence both symbolic: BERT's position ids, sliced from a 64-row
  buffer, broadcast against the sequence only where ``seq <= 64`` is given
  (refused without it, naming the node; decided with it).
"""

from __future__ import annotations

import functools
import io
import pathlib
import sys

import jax
import numpy as np
import onnx
import onnx.helper as oh
import onnxruntime
import pytest
from jax.sharding import Mesh
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.errors import NodeError
from onnx2jax.export import export, load
from sharding.megatron import megatron_plan

DATA = ZOO.parent
ROOT = DATA.parents[1]
MODELS = {name: ZOO / f"{name}.onnx" for name in CASES}
MODELS["tiny_bert"] = DATA / "tiny_bert.onnx"


def _batch():
    (batch,) = jax.export.symbolic_shape("batch")
    return batch


def _feeds(path: pathlib.Path, size: int) -> dict[str, np.ndarray]:
    """The stored inputs grown or cut to ``size`` rows; an added row reversed, its mask padding the end."""
    stored = dict(np.load(path.with_suffix(".inputs.npz")))
    feeds = {}
    for name, value in stored.items():
        extra = value[::-1, ::-1].copy() if "mask" not in name else value.copy()
        if "mask" in name:
            extra[:, -4:] = 0
        feeds[name] = np.concatenate([value, extra])[:size]
    return feeds


def _check_artifact(compiled, path: pathlib.Path, sizes=(1, 3)) -> None:
    stored = dict(np.load(path.with_suffix(".inputs.npz")))
    batch = _batch()  # one symbol for every input: they share their batch
    specs = {k: jax.ShapeDtypeStruct((batch, *v.shape[1:]), v.dtype) for k, v in stored.items()}
    artifact = load(io.BytesIO(export(compiled, **specs)))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size in sizes:
        feeds = _feeds(path, size)
        outputs = artifact(**feeds)
        references = session.run(None, feeds)
        expected = compiled(**feeds)
        assert len(outputs) == len(references) == len(expected)
        for out, ref, exp in zip(outputs, references, expected):
            assert out.shape == ref.shape and out.shape[0] == size
            np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(np.asarray(out), np.asarray(exp), rtol=1e-5, atol=1e-5)
            assert out.sharding.is_equivalent_to(exp.sharding, out.ndim)
    for array, name in zip(artifact.params, compiled.params):
        assert array.sharding.is_equivalent_to(compiled.params[name].sharding, array.ndim), name


def _params(quick: tuple[str, ...]) -> list:
    """The whole zoo; all but ``quick`` marked slow, to keep the default suite within its time (Mistral and
    Qwen2 are Llama's family, which tiny Llama's export tests run)."""
    return [pytest.param(n, marks=[] if n in quick else [pytest.mark.slow]) for n in MODELS]


@functools.lru_cache(maxsize=None)
def _model(name: str) -> onnx.ModelProto:
    return onnx.load(MODELS[name])


@pytest.mark.parametrize("name", _params(("gpt2",)))  # the encoder's unsharded export: slow (sharded below)
def test_zoo_exports_with_a_symbolic_batch_unsharded(name) -> None:
    _check_artifact(onnx2jax.compile(_model(name)), MODELS[name])


@pytest.mark.parametrize("name", _params(("tiny_bert",)))  # the decoder's sharded export: slow (unsharded above)
def test_zoo_exports_with_a_symbolic_batch_sharded(name) -> None:
    tp = CASES[name].tp if name in CASES else 8
    compiled = onnx2jax.compile(megatron_plan(_model(name), tp))
    assert any(not p.sharding.is_fully_replicated for p in compiled.params.values())
    _check_artifact(compiled, MODELS[name])


def _shape_chain_model() -> onnx.ModelProto:
    """x [batch, 6] through the shape ops of a torch export, each result an output (the shape itself too)."""
    i64 = lambda name, values: oh.make_tensor(name, onnx.TensorProto.INT64, [len(values)], values)  # noqa: E731
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"], name="shape"),
        oh.make_node("Gather", ["shape", "zero_scalar"], ["b"], name="gather", axis=0),
        oh.make_node("Unsqueeze", ["b", "axis0"], ["b1"], name="unsqueeze"),
        oh.make_node("Concat", ["b1", "two_three"], ["target"], name="concat", axis=0),
        oh.make_node("Reshape", ["x", "target"], ["reshaped"], name="reshape"),
        oh.make_node("Reshape", ["x", "minus_one_three"], ["halves"], name="reshape_infer"),
        oh.make_node("Reshape", ["x", "zero_two_minus_one"], ["kept"], name="reshape_copy"),
        oh.make_node("Concat", ["b1", "four"], ["expand_to"], name="concat_expand", axis=0),
        oh.make_node("Expand", ["one_by_one", "expand_to"], ["expanded"], name="expand"),
        oh.make_node("Concat", ["b1", "two"], ["filled_shape"], name="concat_fill", axis=0),
        oh.make_node("ConstantOfShape", ["filled_shape"], ["filled"], name="fill",
                     value=oh.make_tensor("v", onnx.TensorProto.FLOAT, [1], [1.5])),
        oh.make_node("Range", ["zero_scalar", "b", "one_scalar"], ["positions"], name="range"),
        oh.make_node("Slice", ["x", "starts", "ends", "axes"], ["sliced"], name="slice"),
        oh.make_node("Slice", ["x", "zero", "big", "zero"], ["whole"], name="slice_whole"),
        oh.make_node("Mul", ["b", "two_scalar"], ["double"], name="mul"),
        oh.make_node("Sub", ["double", "one_scalar"], ["odd"], name="sub"),
        oh.make_node("Max", ["odd", "four_scalar"], ["at_least_four"], name="max"),
        oh.make_node("Size", ["x"], ["size"], name="size"),
        oh.make_node("Add", ["size", "at_least_four"], ["total"], name="add"),
        oh.make_node("Cast", ["total"], ["total_f"], name="cast", to=onnx.TensorProto.FLOAT),
        oh.make_node("Mul", ["x", "total_f"], ["scaled"], name="scale"),
    ]
    inits = [
        i64("zero", [0]), i64("axis0", [0]), i64("two_three", [2, 3]), i64("minus_one_three", [-1, 3]),
        i64("zero_two_minus_one", [0, 2, -1]), i64("four", [4]), i64("two", [2]), i64("starts", [1]),
        i64("ends", [3]), i64("axes", [1]), i64("big", [2**63 - 1]),
        oh.make_tensor("one_by_one", onnx.TensorProto.FLOAT, [1, 1], [2.0]),
        oh.make_tensor("zero_scalar", onnx.TensorProto.INT64, [], [0]),
        oh.make_tensor("one_scalar", onnx.TensorProto.INT64, [], [1]),
        oh.make_tensor("two_scalar", onnx.TensorProto.INT64, [], [2]),
        oh.make_tensor("four_scalar", onnx.TensorProto.INT64, [], [4]),
    ]
    outputs = ["shape", "reshaped", "halves", "kept", "expanded", "filled", "positions", "sliced", "whole", "scaled"]
    graph = oh.make_graph(
        nodes, "shape_chain", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 6])],
        [oh.make_tensor_value_info(o, onnx.TensorProto.INT64 if o in ("shape", "positions") else onnx.TensorProto.FLOAT, None)
         for o in outputs], inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


def test_shape_chain_ops_take_a_symbolic_batch() -> None:
    model = _shape_chain_model()
    compiled = onnx2jax.compile(model)
    artifact = load(io.BytesIO(export(compiled, jax.ShapeDtypeStruct((_batch(), 6), np.float32))))
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for size in (1, 2, 5):
        x = np.random.default_rng(size).standard_normal((size, 6)).astype(np.float32)
        outputs = artifact(x)
        for name, out, ref in zip(artifact.output_names, outputs, session.run(None, {"x": x})):
            assert out.shape == ref.shape, name
            np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, err_msg=name)


def _comparing_model(op: str) -> onnx.ModelProto:
    """x [batch, 4] scaled by 2 where ``op(batch, 4)`` holds: a branch on the batch's value."""
    nodes = [
        oh.make_node("Shape", ["x"], ["shape"], name="shape", start=0, end=1),
        oh.make_node(op, ["shape", "four"], ["decided"], name="decide_on_batch"),
        oh.make_node("Where", ["decided", "two", "one"], ["factor"], name="where"),
        oh.make_node("Mul", ["x", "factor"], ["y"], name="mul"),
    ]
    inits = [
        oh.make_tensor("four", onnx.TensorProto.INT64, [1], [4]),
        oh.make_tensor("two", onnx.TensorProto.FLOAT, [1], [2.0]),
        oh.make_tensor("one", onnx.TensorProto.FLOAT, [1], [1.0]),
    ]
    graph = oh.make_graph(
        nodes, "compare", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9)


@pytest.mark.parametrize("op", ["Equal", "Less", "GreaterOrEqual"])
def test_a_comparison_on_the_symbolic_batch_is_refused_by_node(op) -> None:
    compiled = onnx2jax.compile(_comparing_model(op))
    x = np.ones((3, 4), np.float32)
    assert np.asarray(compiled(x)[0]).shape == (3, 4)  # at a concrete batch the model runs
    with pytest.raises(NodeError, match=r"decide_on_batch.*depends on the value of a symbolic dimension"):
        export(compiled, jax.ShapeDtypeStruct((_batch(), 4), np.float32))


def test_a_decidable_comparison_on_the_symbolic_batch_is_folded() -> None:
    """batch >= 1 holds for every batch (jax's default constraint on a symbolic dim), so
    GreaterOrEqual(batch, 1) is decided (true: the factor is 2), not refused."""
    model = _comparing_model("GreaterOrEqual")
    model.graph.initializer[0].CopyFrom(oh.make_tensor("four", onnx.TensorProto.INT64, [1], [1]))
    compiled = onnx2jax.compile(model)
    artifact = load(io.BytesIO(export(compiled, jax.ShapeDtypeStruct((_batch(), 4), np.float32))))
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(np.asarray(artifact(x)[0]), 2 * x)


def test_a_spec_splitting_the_symbolic_batch_is_kept() -> None:
    """Data x tensor parallel (examples/data_and_tensor_parallel.py): the spec splits the batch over the
    data axis. The rule: a split the spec writes on a symbolic axis is kept (inference treats the batch
    as the model's own dim_param, as at compile time); batch 2 comes back split over the data axis, and
    an uneven batch (3: XLA pads the last shard inside the program) is still right, returned whole."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from data_and_tensor_parallel import FIXTURE, data_parallel_plan
    finally:
        sys.path.remove(str(ROOT / "examples"))
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    compiled = onnx2jax.compile(data_parallel_plan(onnx.load(str(FIXTURE))), mesh, scan_layers=False)
    artifact = load(io.BytesIO(export(compiled, jax.ShapeDtypeStruct((_batch(), 16), np.int64))))
    session = onnxruntime.InferenceSession(str(FIXTURE), providers=["CPUExecutionProvider"])
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    for size, spec in ((2, ("data", None, "model")), (4, ("data", None, "model")), (3, (None, None, "model"))):
        batch_ids = np.concatenate([ids, ids[::-1]])[:size]
        (logits,) = artifact(batch_ids)
        np.testing.assert_allclose(np.asarray(logits), session.run(None, {"input_ids": batch_ids})[0], rtol=1e-4, atol=1e-4)
        assert tuple(logits.sharding.spec) + (None,) * (3 - len(logits.sharding.spec)) == spec, size


def test_a_squeeze_of_every_unit_axis_is_refused_on_a_symbolic_batch() -> None:
    """Squeeze without axes drops every axis of size 1: the batch too where it is 1, so it is refused."""
    graph = oh.make_graph(
        [oh.make_node("Squeeze", ["x"], ["y"], name="squeeze_all")], "squeeze",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 1, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    compiled = onnx2jax.compile(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=9))
    with pytest.raises(NodeError, match=r"squeeze_all.*depends on its value"):
        export(compiled, jax.ShapeDtypeStruct((_batch(), 1, 4), np.float32))


SEQUENCE_MODELS = {"tiny_llama": DATA / "tiny_llama.onnx", "gpt2": MODELS["gpt2"], "t5": MODELS["t5"],
                   "tiny_bert": MODELS["tiny_bert"]}


# a decoder with RoPE and an encoder-decoder by default; GPT-2 and the BERT encoder: slow
@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n in ("tiny_llama", "t5") else [pytest.mark.slow])
                                  for n in SEQUENCE_MODELS])
def test_batch_and_sequence_symbolic_sharded(name) -> None:
    """One artifact of the TP 8 model serves (batch, seq) (1, 5) and (3, 16), equal to onnxruntime."""
    path = SEQUENCE_MODELS[name]
    compiled = onnx2jax.compile(megatron_plan(onnx.load(path), 8))
    batch, seq = jax.export.symbolic_shape("batch, seq", constraints=["seq <= 64"])
    stored = dict(np.load(path.with_suffix(".inputs.npz")))
    artifact = load(io.BytesIO(export(compiled, **{k: jax.ShapeDtypeStruct((batch, seq), v.dtype) for k, v in stored.items()})))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for size, length in ((1, 5), (3, 16)):
        feeds = {k: v[:, :length] for k, v in _feeds(path, size).items()}
        for out, ref in zip(artifact(**feeds), session.run(None, feeds)):
            assert out.shape == ref.shape
            np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)


def test_an_undecided_sequence_bound_is_refused_by_node() -> None:
    """Without ``seq <= 64`` BERT's positions (``min(seq, 64)`` rows) may not broadcast against ``seq``."""
    compiled = onnx2jax.compile(_model("tiny_bert"))
    batch, seq = jax.export.symbolic_shape("batch, seq")
    specs = {k: jax.ShapeDtypeStruct((batch, seq), np.int64) for k in ("input_ids", "attention_mask")}
    with pytest.raises(NodeError, match=r"node_expand_1.*min\(seq, 64\) == seq depends on the value"):
        export(compiled, **specs)
