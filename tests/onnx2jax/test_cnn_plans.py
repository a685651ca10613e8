"""CNN plans (issue 23): the zoo's ResNet and ConvNeXt at 2/4/8 devices, data or tensor parallel.

`megatron_plan(model, n, batch=b)` picks, for a model with convolutions, data
parallelism when the devices divide the batch (a forward pass then moves no
bytes) and its column/row pairs otherwise: ResNet's channel-parallel conv pairs
(conv -> ReLU -> conv in each basic block), ConvNeXt's pointwise Linear pairs.
The minimum here is derived from the architecture: 0 collectives data parallel;
one all-reduce per pair (2 blocks: 2) tensor parallel, nothing else. Values
against onnxruntime, run in the test on the same inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from zoo_cases import ZOO

import onnx2jax
from onnx2jax.runtime.spmd import count_collectives
from sharding.megatron import megatron_layout, megatron_plan

PAIRS = {"resnet": 2, "convnext": 2}  # one per block: 2 blocks each


@pytest.mark.parametrize("name", sorted(PAIRS))
@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("batch", [2, 8])
def test_cnn_plan_values_and_collectives(name, devices, batch):
    model = onnx.load(ZOO / f"{name}.onnx")
    x = np.random.default_rng(devices + batch).standard_normal((batch, 3, 32, 32)).astype(np.float32)
    data_parallel = batch % devices == 0
    layout = megatron_layout(model, devices, batch=batch)
    assert any(note.startswith("data parallel: ") for note in layout.notes) == data_parallel
    compiled = onnx2jax.compile(megatron_plan(model, devices, batch=batch))
    (logits,) = compiled(pixel_values=x)
    (expected,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"pixel_values": x}
    )
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=2e-5)
    counts = count_collectives(compiled.compiled_text(pixel_values=x))
    minimum = 0 if data_parallel else PAIRS[name]
    assert counts == {"all-reduce": minimum, "all-gather": 0, "all-to-all": 0, "collective-permute": 0,
                      "reduce-scatter": 0}
    if data_parallel:  # the plan states why: nothing moves, weights replicated
        assert layout.pairs == () and layout.conv_pairs == ()
    else:
        assert len(layout.pairs) + len(layout.conv_pairs) == PAIRS[name]


def test_without_a_batch_the_cnn_plan_is_channel_parallel():
    """The batch unknown (symbolic), data parallel cannot be chosen safely: conv pairs."""
    layout = megatron_layout(onnx.load(ZOO / "resnet.onnx"), 8)
    assert len(layout.conv_pairs) == 2
    assert not any(note.startswith("data parallel") for note in layout.notes)
