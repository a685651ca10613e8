"""bench/tpu_targets.py's smallest configurations run (issue 41's Goals; the 8B and 70B runs are the bench's).

References: the ONNX file's own initializer dims (the weight bytes), a hand count of a Megatron plan's
collectives (an all-reduce after each layer's attention output and MLP output, one after the
vocabulary-split embedding lookup, each of the [batch, seq, width] bf16 hidden state), the sparse data file's
allocated blocks (never written), and the refusal named by class. Nothing here touches a TPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from onnx2jax.runtime import targets

pytestmark = pytest.mark.skipif(not targets.libtpu_available(), reason="libtpu (the test extra) is not installed")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import tpu_targets  # noqa: E402


def test_tiny_decoder_compiles_for_v5e_at_tp8_with_a_megatron_plans_collectives(tmp_path):
    result = tpu_targets.run_prefill("tiny", tmp_path, "tpu:v5e:2x4", 8, 1, 16)
    path = tpu_targets.make("tiny", tmp_path)
    proto = onnx.load(str(path), load_external_data=False)
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.data_type for t in external} == {onnx.TensorProto.BFLOAT16}
    assert result["weight_bytes"] == sum(int(np.prod(t.dims)) * 2 for t in external)
    assert os.stat(path.with_suffix(".data")).st_blocks == 0  # sparse: no weight was ever written
    assert result["scanned"]
    report, shape = result["report"], tpu_targets.TINY
    assert report["chips"] == 8 and report["fits"]
    expected_count = 2 * shape.layers + 1
    assert report["collectives"] == {
        "all-reduce ICI": {"count": expected_count, "bytes": expected_count * 1 * 16 * shape.width * 2}
    }
    # The compiler's FLOPs per chip (loop trips corrected) at least the matmuls' 2 x params / 8 per token.
    assert report["flops"] >= 2 * 16 * (result["weight_bytes"] / 2 - shape.vocab * shape.width) / 8


def test_a_configuration_that_does_not_fit_is_refused_by_name_before_compiling(tmp_path):
    weights = tpu_targets.analytic_peak(tpu_targets.TINY, 8, 1, 16)["weights"]
    result = tpu_targets.run_refuse("tiny", tmp_path, "tpu:v5e:2x4", 1, 16, memory_per_device=weights // 4)
    assert result["refused"] == "MemoryLimitError"
    assert f"{weights // 4:,}" in result["message"] or str(weights // 4) in result["message"]


@pytest.mark.slow
def test_two_slices_all_reduce_every_weight_matrix_gradient_shard_over_dcn(tmp_path):
    result = tpu_targets.run_multislice("small", tmp_path, "tpu:v5e:2x4", 4, 128)
    shape = tpu_targets.SMALL
    assert result["report"]["slices"] == 2 and result["mesh"] == {"d0": 2, "d1": 8}
    # Hand count: each weight matrix split 8 ways within a slice; its gradient shard crosses the slices once.
    d, f, v = shape.width, shape.ffn, shape.vocab
    shards = sorted([d * d * 2 // 8] * (4 * shape.layers) + [d * f * 2 // 8] * (3 * shape.layers)
                    + [v * d * 2 // 8] * 2)
    large = [b for b in result["dcn_all_reduce_bytes"] if b >= min(shards)]
    assert sorted(large) == shards
    assert sum(shards) * 8 == tpu_targets.weight_bytes(shape)[1]
