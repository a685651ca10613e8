"""The encoders of issue 41 at their collective minimum, on the CPU program and on the TPU program.

The `*_shared` zoo encoders (ViT, Wav2Vec2, Whisper's encoder; hidden 64, 2 blocks, 4
heads, FFN 128) keep transformers' initialisation, so the exporter folds equal constants
into shared initializers: one [64] of zeros is every q/k/v bias (read column-split at TP 4),
every output bias and every LayerNorm bias (read whole). The first LayerNorm follows the
front end, which no spec reaches. Reading the split copy of that bias, XLA computed the norm
split and gathered it: one all-gather of [2,S,64] on CPU, an all-reduce of the [64] bias
built by dynamic-update-slice into zeros on a TPU (issue 41).

The minimum at TP 4, from the architecture: each block has two row-parallel products
(attention output, MLP down) whose partial sums meet in one all-reduce each, 2 x 2 = 4;
the front end, the positions and every LayerNorm run on whole activations (the residual
stream is whole after each all-reduce), so nothing is gathered.

The TPU programs are compiled for v5e:2x4's first 4 chips with compile-only devices
(`tpu_compile`).
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from test_zoo import _predicted_bytes
from tpu_compile import tpu_hlo
from zoo_cases import CASES, ZOO

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding import auto_plan
from sharding.megatron import megatron_plan
from sharding.model_configs import read_model_configs

ENCODERS = ["vit_shared", "wav2vec2_shared", "whisper_encoder_shared"]
TP = 4
MINIMUM = {"all-reduce": 4, "all-gather": 0, "all-to-all": 0, "collective-permute": 0, "reduce-scatter": 0}


def _inputs(name: str) -> dict[str, np.ndarray]:
    return dict(np.load(ZOO / f"{name}.inputs.npz"))


@functools.lru_cache(maxsize=None)
def _hand(name: str) -> onnx.ModelProto:
    return megatron_plan(onnx.load(ZOO / f"{name}.onnx"), TP)


@functools.lru_cache(maxsize=None)
def _auto(name: str) -> onnx.ModelProto:
    annotated, _ = auto_plan(onnx.load(ZOO / f"{name}.onnx"), {"data": 1, "tensor": TP}, batch=2)
    return annotated


def _check_cpu(model: onnx.ModelProto, name: str):
    compiled = onnx2jax.compile(model)
    inputs = _inputs(name)
    outputs = compiled(**inputs)
    reference = np.load(ZOO / f"{name}.ort_outputs.npz")
    assert len(outputs) == len(reference.files)
    for output_name, value in zip(compiled.model.output_names, outputs):
        np.testing.assert_allclose(np.asarray(value), reference[output_name], rtol=1e-4, atol=2e-5)
    assert count_collectives(compiled.compiled_text(**inputs)) == MINIMUM
    return compiled


def test_the_shared_encoders_share_a_bias_between_split_and_whole_readers():
    """The fixtures are what the tests need: a LayerNormalization with no spec written reads an
    initializer that a bias Add reads column-split."""
    for name in ENCODERS:
        model = _hand(name)
        split_biases = {s.tensor_name for n in model.graph.node if n.op_type == "Add"
                        for s in _written(model, n.name) if "0:4" in str(s)}
        norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"
                 and not _written(model, n.name) and set(n.input[1:]) & split_biases]
        assert norms, name


def _written(model: onnx.ModelProto, node: str) -> list:
    (configs,) = read_model_configs(model).values()
    config = configs.get(node)
    return list(config.specs) if config else []


@pytest.mark.parametrize("name", ENCODERS)
def test_hand_plan_cpu_program_is_the_minimum(name):
    """Values equal onnxruntime's; 4 all-reduces and nothing else; the shared bias is held split for
    its column readers and whole for its other readers (the bytes test_zoo predicts from the specs)."""
    compiled = _check_cpu(_hand(name), name)
    predicted = _predicted_bytes(_hand(name), compiled.logical_params, TP)
    assert compiled.report().param_bytes_per_device == predicted


@pytest.mark.parametrize("name", ENCODERS)
def test_hand_plan_tpu_program_is_the_minimum(name):
    assert count_collectives(tpu_hlo(_hand(name), _inputs(name), TP)) == MINIMUM


@pytest.mark.slow
@pytest.mark.parametrize("name", ENCODERS)
def test_automatic_plan_cpu_and_tpu_programs_are_the_minimum(name):
    """The automatic plan at tensor 4 (data 1) writes the same Megatron layout here: the same minimum."""
    _check_cpu(_auto(name), name)
    assert count_collectives(tpu_hlo(_auto(name), _inputs(name), TP)) == MINIMUM


# On the TPU, XLA's all-reduce combiner merges more independent all-reduces than on CPU: T5's
# 12 partial sums are 11 all-reduces on CPU (zoo_cases: one tuple of two) and 10 on v5e (two
# tuples of two): the same partial sums, the same bytes, one launch fewer.
TPU_MERGED = {"t5": 1}


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, case in CASES.items() if case.tp > 1])
def test_zoo_tpu_program_is_the_plan_minimum(name):
    """Every zoo architecture under the hand plan, compiled for v5e: the zoo's analytic minimum."""
    case = CASES[name]
    model = megatron_plan(onnx.load(ZOO / f"{name}.onnx"), case.tp)
    counts = count_collectives(tpu_hlo(model, _inputs(name), case.tp))
    all_reduce, all_gather = case.minimum
    others = {k: v for k, v in counts.items() if k not in ("all-reduce", "all-gather") and v}
    assert (counts["all-reduce"], counts["all-gather"], others) == (
        all_reduce - TPU_MERGED.get(name, 0), all_gather, {}), case.why
