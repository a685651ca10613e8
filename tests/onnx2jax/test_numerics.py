"""The precision of every matrix product (`onnx2jax.numerics`): one option, read from the lowered StableHLO.

* CPU, default: every ``dot_general`` of the tiny Llama and of three sharded minimal graphs (per-device
  stacks, partial sums, fused-weight views: the products `onnx2jax.runtime` writes itself) carries
  ``HIGHEST``, and the tiny Llama's logits still match onnxruntime's stored outputs;
* ``precision="default"`` (and ``"high"``) reaches every one of those dots, and nothing else changes
  on CPU (XLA's CPU product is float32 at any precision: same values as onnxruntime);
* a TPU target (compile-only v5e devices from libtpu): ``"auto"`` keeps float32 products at ``HIGHEST``
  and computes bfloat16 ones in one pass (``DEFAULT``); both programs compile for the TPU;
* the int4 fixture compiles for v5e:2x4 from this CPU host (MatMulNBits' kernel chosen by the program's platform);
* a large folded causal mask is computed in the program, not baked in as a constant (``FOLD_LIMIT_BYTES``);
* ``compute_dtype="bfloat16"``: a float32 zoo export held and computed in bf16, against onnxruntime; for a
  TPU, its products then lower in one bf16 pass.
"""

from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import onnxruntime as ort
import pytest
from minimal_graphs import fused_qkv_slices, gemm_gate_up, inputs_for, parallel_residual
from onnx import TensorProto, helper, numpy_helper

import onnx2jax
from onnx2jax import numerics
from onnx2jax.runtime.constraints import ShardingHooks

DATA = pathlib.Path(__file__).parents[1] / "data"
DOT = re.compile(r"stablehlo\.(?:dot_general|convolution)\b[^\n]*")


def _precisions(text: str) -> list[str]:
    """Each product's precision in StableHLO text (``DEFAULT`` where none is written: XLA's default)."""
    found = []
    for line in DOT.findall(text):
        m = re.search(r"precision = \[(\w+), (\w+)\]", line)
        found.append(m.group(1) if m and m.group(1) == m.group(2) else ("DEFAULT" if m is None else "MIXED"))
    return found


def _llama():
    inputs = dict(np.load(DATA / "tiny_llama.inputs.npz"))
    expected = list(np.load(DATA / "tiny_llama.ort_outputs.npz").values())
    return DATA / "tiny_llama.onnx", inputs, expected


@pytest.mark.parametrize("precision", ["auto", "default"])
def test_tiny_llama_every_dot_takes_the_option_and_values_match_onnxruntime(precision):
    path, inputs, expected = _llama()
    compiled = onnx2jax.compile(str(path), precision=precision)
    found = _precisions(compiled.lower(**inputs).as_text())
    assert len(found) >= 4  # q, k, v, o, MLP and attention products of each layer, and the head
    assert set(found) == {"HIGHEST" if precision == "auto" else "DEFAULT"}, found
    if precision == "auto":
        return  # its values against onnxruntime: tests/onnx2jax/test_fixtures.py
    (logits,) = compiled(**inputs)[:1]
    np.testing.assert_allclose(np.asarray(logits), expected[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("build", [parallel_residual, gemm_gate_up, fused_qkv_slices])
@pytest.mark.parametrize("precision", ["auto", "high"])
def test_sharded_products_take_the_option(build, precision, monkeypatch):
    """Sharded on 8 devices, where onnx2jax writes the products itself (stacks, partial sums, views)."""
    model = build()
    used = []
    for hook in ("_column_parallel", "_add_partials"):  # which of onnx2jax's own sharded products ran
        original = getattr(ShardingHooks, hook)
        monkeypatch.setattr(ShardingHooks, hook, lambda self, *a, _o=original, _h=hook: used.append(_h) or _o(self, *a))
    x = inputs_for(model)["x"] if build is fused_qkv_slices else np.random.default_rng(0).normal(
        size=(2, 16, 16) if build is parallel_residual else (12, 16)).astype(np.float32)
    compiled = onnx2jax.compile(model, precision=precision)
    found = _precisions(compiled.lower(x).as_text())
    assert found and set(found) == {"HIGHEST" if precision == "auto" else "HIGH"}, found
    assert used  # the program went through the sharded runtime's products, not jnp's alone
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(np.asarray(compiled(x)[0]), expected[0], rtol=1e-4, atol=1e-4)


def test_an_unknown_precision_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="'auto', 'highest', 'high', 'default'.*'fastest'"):
        onnx2jax.compile(str(DATA / "tiny_llama.onnx"), precision="fastest")
    with pytest.raises(ValueError, match="precision must be one of"):
        onnx2jax.translate(str(DATA / "tiny_llama.onnx"), precision="bf16")


def _products(dtype: int) -> object:
    """y = Gemm(MatMul(x, w1), w2): two products, all in ``dtype``."""
    rng = np.random.default_rng(1)
    weights = []
    for name, shape in (("w1", (8, 16)), ("w2", (16, 4))):
        values = rng.normal(size=shape).astype(np.float32)
        if dtype == TensorProto.BFLOAT16:
            weights.append(helper.make_tensor(name, dtype, shape, values.ravel().tolist()))
        else:
            weights.append(numpy_helper.from_array(values, name))
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Gemm", ["h", "w2"], ["y"])], "products",
        [helper.make_tensor_value_info("x", dtype, [2, 8])], [helper.make_tensor_value_info("y", dtype, [2, 4])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def tpu_mesh():
    topologies = pytest.importorskip("jax.experimental.topologies")
    try:
        devices = topologies.get_topology_desc("v5e:2x4", platform="tpu").devices
    except Exception as error:  # noqa: BLE001 - libtpu absent or refusing: say which
        pytest.skip(f"no compile-only TPU devices here (libtpu): {error}")
    return jax.sharding.Mesh(np.array(devices), ("d",))


@pytest.mark.parametrize("dtype, want", [(TensorProto.FLOAT, "HIGHEST"), (TensorProto.BFLOAT16, "DEFAULT")])
def test_auto_on_a_tpu_keeps_float32_and_runs_bf16_in_one_pass(tpu_mesh, dtype, want):
    model = onnx2jax.translate(_products(dtype))
    replicated = jax.sharding.NamedSharding(tpu_mesh, jax.sharding.PartitionSpec())
    jdtype = jnp.float32 if dtype == TensorProto.FLOAT else jnp.bfloat16
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in model.params.items()}
    x = jax.ShapeDtypeStruct((2, 8), jdtype, sharding=replicated)
    with jax.set_mesh(tpu_mesh):
        lowered = jax.jit(model.fn).lower(params, x)
    assert _precisions(lowered.as_text()) == [want, want]
    lowered.compile()  # the TPU compiler takes it
    with numerics.on_platform("cpu"):  # the same model for a CPU: ONNX's float32 fidelity whatever the dtype
        cpu = jax.jit(model.fn).lower({k: jnp.asarray(v) for k, v in model.params.items()}, jnp.zeros((2, 8), jdtype))
    assert _precisions(cpu.as_text()) == ["HIGHEST", "HIGHEST"]


INT4 = DATA / "genai" / "llama_gqa_int4" / "model.onnx"


def test_int4_model_compiles_for_a_tpu_from_this_cpu_host(tpu_mesh):
    """MatMulNBits picks its kernel by the program's platform: for a TPU mesh, the portable unpacking (the CPU
    custom call has no TPU emitter), although jax's default backend here is the CPU."""
    from onnx2jax.ops import nbits_kernel

    model = onnx2jax.translate(str(INT4))
    assert any(n.op_type == "MatMulNBits" for n in model.proto.graph.node)
    batch, past, new = 8, 4, 3
    sizes = {"batch_size": batch, "sequence_length": new, "total_sequence_length": past + new,
             "past_sequence_length": past, "kv_cache_dim": 16}
    rows = jax.sharding.NamedSharding(tpu_mesh, jax.sharding.PartitionSpec("d"))
    replicated = jax.sharding.NamedSharding(tpu_mesh, jax.sharding.PartitionSpec())
    inputs = {i.name: jax.ShapeDtypeStruct(tuple(sizes.get(d, d) for d in i.shape), i.dtype, sharding=rows)
              for i in model.inputs}
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in model.params.items()}
    with jax.enable_x64(True), jax.set_mesh(tpu_mesh):
        lowered = jax.jit(lambda p, values: model.fn(p, **values)).lower(params, inputs)
    text = lowered.as_text()
    assert nbits_kernel.TARGET not in text
    assert "DEFAULT" not in _precisions(text)  # a float32 model: HIGHEST on the TPU too
    compiled = lowered.compile()
    assert compiled.as_text()  # the TPU executable's HLO
    if nbits_kernel.available():  # and for a CPU mesh, the kernel is still what runs
        cpu = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("d",))
        with jax.enable_x64(True), jax.set_mesh(cpu):
            on_cpu = jax.jit(lambda p, values: model.fn(p, **values)).lower(
                {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in model.params.items()},
                {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in inputs.items()})
        assert nbits_kernel.TARGET in on_cpu.as_text()


HLO_WIDTH = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}


def _constants(text: str) -> dict[str, int]:
    """Each constant's type in StableHLO text -> its bytes (bool as one byte, as XLA holds ``pred``)."""
    width = {"i1": 1, "i8": 1, "ui8": 1, "i16": 2, "bf16": 2, "f16": 2, "i32": 4, "ui32": 4, "f32": 4, "i64": 8,
             "ui64": 8, "f64": 8}
    found = {}
    for kind in re.findall(r"stablehlo\.constant[^\n]*: tensor<([^>]*)>", text):
        *dims, dtype = kind.split("x")
        found[kind] = int(np.prod([int(d) for d in dims], dtype=np.int64)) * width[dtype]
    return found


def test_a_large_causal_mask_is_computed_on_device_not_baked_into_the_program():
    """The tiny Llama's mask [B, 1, S, S] is folded from constants at trace time; at [2, 512] (512 KiB) it is
    over the limit and computed in the program: no constant of the lowered or the compiled program is over
    ``FOLD_LIMIT_BYTES``, and the logits match onnxruntime's. At [2, 16] (512 bytes) it still folds."""
    from onnx2jax.graph_runner import FOLD_LIMIT_BYTES

    model = onnx2jax.translate(str(DATA / "tiny_llama.onnx"))
    small = np.zeros((2, 16), np.int64)
    with jax.enable_x64(True):
        folded = _constants(jax.jit(model.fn).lower(model.params, small).as_text())
    assert "2x1x16x16xi1" in folded  # below the limit: the mask is a constant, as before
    ids = np.random.default_rng(5).integers(0, 256, size=(2, 512)).astype(np.int64)
    with jax.enable_x64(True):
        lowered = jax.jit(model.fn).lower(model.params, ids)
        compiled = lowered.compile()
    constants = _constants(lowered.as_text())
    assert max(constants.values()) <= FOLD_LIMIT_BYTES, constants
    hlo = re.findall(r"= (\w+)\[([0-9,]*)\]\{?[^ ]* constant\(", compiled.as_text())
    hlo_bytes = [HLO_WIDTH[t] * int(np.prod([int(d) for d in dims.split(",") if d])) for t, dims in hlo]
    assert max(hlo_bytes) <= FOLD_LIMIT_BYTES, hlo  # XLA did not fold the mask back in
    session = ort.InferenceSession(str(DATA / "tiny_llama.onnx"), providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"input_ids": ids})[:1]
    with jax.enable_x64(True):
        (logits,) = compiled(model.params, ids)[:1]
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)


BF16_EPS = 2.0**-8  # bfloat16's machine epsilon (8 significand bits): one rounding moves a value by up to half of it


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_compute_dtype_bfloat16_holds_bf16_weights_and_stays_within_bf16_error_of_onnxruntime(name):
    """A float32 zoo export run in bfloat16: parameters held in bf16 (half the bytes), every product on bf16
    operands, float32 logits out, and the logits within ``8 * eps * max|logit|`` of onnxruntime's float32 ones.

    The tolerance: each of the two layers rounds its residual stream, norms and products to bf16 (relative
    error eps/2 each, round to nearest) and the errors of a few such roundings add up; measured, these models
    land at 0.6-0.7% of the largest logit, about 1.6-1.8 eps, so 8 eps (3.1%) bounds it with room. That the run
    is really bf16 is checked too: its error is over 1e-3 of the largest logit, which a float32 run (within
    1e-4 of onnxruntime in the zoo's tests) does not reach."""
    inputs = dict(np.load(DATA / "zoo" / f"{name}.inputs.npz"))
    expected = list(np.load(DATA / "zoo" / f"{name}.ort_outputs.npz").values())
    compiled = onnx2jax.compile(str(DATA / "zoo" / f"{name}.onnx"), compute_dtype="bfloat16")
    fp32 = onnx2jax.translate(str(DATA / "zoo" / f"{name}.onnx"))
    assert {str(a.dtype) for a in compiled.params.values()} == {"bfloat16"}
    assert sum(a.nbytes for a in compiled.params.values()) * 2 == sum(a.nbytes for a in fp32.params.values())
    text = compiled.lower(**inputs).as_text()
    products = DOT.findall(text)
    assert products and all(re.search(r"\(tensor<[0-9x]*bf16>, tensor<[0-9x]*bf16>\)", p) for p in products), products
    (logits,) = compiled(**inputs)[:1]
    assert logits.dtype == np.float32  # the model's declared type
    scale = float(np.abs(expected[0]).max())
    error = float(np.abs(np.asarray(logits) - expected[0]).max())
    assert error <= 8 * BF16_EPS * scale, (error, scale)
    assert error > 1e-3 * scale  # bf16-sized, not float32-sized: the option took effect
    np.testing.assert_array_equal(np.asarray(logits).argmax(-1), expected[0].argmax(-1))


def test_an_unknown_compute_dtype_is_refused():
    with pytest.raises(ValueError, match="compute_dtype must be None or one of 'bfloat16', 'float16', got 'int8'"):
        onnx2jax.compile(str(DATA / "tiny_llama.onnx"), compute_dtype="int8")


def test_compute_dtype_on_a_tpu_runs_every_product_in_one_bf16_pass(tpu_mesh):
    """The two options together, as a TPU user of a float32 export sets them: bf16 compute, and ``"auto"``
    precision then lowers every product of the program for the TPU with ``DEFAULT`` (the float32 export
    alone keeps ``HIGHEST``: the first test of this file)."""
    model = onnx2jax.translate(str(DATA / "zoo" / "gpt2.onnx"), compute_dtype="bfloat16")
    inputs = dict(np.load(DATA / "zoo" / "gpt2.inputs.npz"))
    replicated = jax.sharding.NamedSharding(tpu_mesh, jax.sharding.PartitionSpec())
    params = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in model.params.items()}
    values = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in inputs.items()}
    with jax.enable_x64(True), jax.set_mesh(tpu_mesh):
        lowered = jax.jit(lambda p, v: model.fn(p, **v)).lower(params, values)
    found = _precisions(lowered.as_text())
    assert found and set(found) == {"DEFAULT"}, found
    assert all(o.dtype == jnp.float32 for o in lowered.out_info)  # the model's declared output type


def test_pipeline_stages_take_both_options():
    """A model with pipeline stages (the tiny Llama cut in two, one device each): each stage's program is
    translated with the options, its parameters held in bf16, and the logits within the bf16 bound of
    onnxruntime's (and bf16-sized: the stages really computed in bf16)."""
    import onnx
    from sharding.annotate import add_configuration, set_stage
    from sharding.stages import auto_stages

    model = onnx.load(DATA / "tiny_llama.onnx")
    stage_of, _ = auto_stages(model, 2)
    add_configuration(model, "pp", 2)
    for node, stage in stage_of.items():
        set_stage(model, node, stage, "pp")
    compiled = onnx2jax.compile(model, precision="high", compute_dtype="bfloat16")
    assert len(compiled.stages) == 2
    for stage in compiled.stages:
        assert stage.compiled.model.precision == "high" and stage.compiled.model.compute_dtype == jnp.bfloat16
        assert {str(a.dtype) for a in stage.compiled.params.values()} == {"bfloat16"}
    inputs = dict(np.load(DATA / "tiny_llama.inputs.npz"))
    (expected,) = np.load(DATA / "tiny_llama.ort_outputs.npz").values()
    (logits,) = compiled(**inputs)
    scale = float(np.abs(expected).max())
    error = float(np.abs(np.asarray(logits, np.float32) - expected).max())
    assert 1e-3 * scale < error <= 8 * BF16_EPS * scale, (error, scale)


def test_a_bf16_run_writes_its_weights_back_in_the_models_own_types():
    """``to_onnx`` of a model held in bf16 writes float32 initializers (the graph's types), holding the bf16
    values: onnxruntime runs it, and its logits are those of the float32 model within the bf16 bound."""
    compiled = onnx2jax.compile(str(DATA / "tiny_llama.onnx"), compute_dtype="bfloat16")
    written = compiled.to_onnx()
    original = {t.name: t.data_type for t in onnx2jax.translate(str(DATA / "tiny_llama.onnx")).proto.graph.initializer}
    assert {t.name: t.data_type for t in written.graph.initializer} == original
    inputs = dict(np.load(DATA / "tiny_llama.inputs.npz"))
    (expected,) = np.load(DATA / "tiny_llama.ort_outputs.npz").values()
    session = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"])
    (logits,) = session.run(None, inputs)
    scale = float(np.abs(expected).max())
    assert float(np.abs(logits - expected).max()) <= 8 * BF16_EPS * scale


def test_onnx2jax_compile_for_a_tpu_mesh_takes_the_platform_from_the_mesh(tpu_mesh):
    """Through ``onnx2jax.compile`` on a mesh of compile-only TPU devices (parameters "placed" as sharded
    ShapeDtypeStructs, as tests/onnx2jax/tpu_compile.py does until ``compile(target=...)`` does it): the
    program's products follow the TPU's ``"auto"`` (bf16 compute: ``DEFAULT``), not the CPU host's."""
    from unittest import mock

    import onnx2jax.runtime.parameters

    def abstract(array, sharding, shape=None):
        return jax.ShapeDtypeStruct(tuple(array.shape if shape is None else shape), array.dtype, sharding=sharding)

    inputs = dict(np.load(DATA / "zoo" / "gpt2.inputs.npz"))
    with mock.patch.object(onnx2jax.runtime.parameters, "place", abstract):
        compiled = onnx2jax.compile(str(DATA / "zoo" / "gpt2.onnx"), tpu_mesh, compute_dtype="bfloat16")
    shardings = compiled.input_shardings({k: v.shape for k, v in inputs.items()})
    values = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shardings[k]) for k, v in inputs.items()}
    found = _precisions(compiled.lower(**values).as_text())
    assert found and set(found) == {"DEFAULT"}, found
