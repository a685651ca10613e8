"""The zoo models (tests/data/zoo) and what their tensor-parallel plan must reach.

Each case's minimum is derived here from the architecture, independently of the
plan: one all-reduce per row-parallel layer (the attention output projection and
the MLP down projection of every block; T5's decoder blocks also have a
cross-attention output) and one per vocabulary-split token-embedding lookup; no
all-gather (logits stay vocabulary-split; a classifier or pooler on a few
features stays replicated and is computed from replicated activations).
The TP degree is the largest of (8, 4, 2) that divides the query heads. The counts
are of HLO ops: XLA's combiner may merge independent all-reduces into one.
"""

from __future__ import annotations

import dataclasses
import pathlib

ZOO = pathlib.Path(__file__).resolve().parents[1] / "data" / "zoo"


@dataclasses.dataclass(frozen=True)
class Case:
    """A zoo model: TP degree and the analytic minimum (all-reduces, all-gathers)."""

    tp: int
    minimum: tuple[int, int]
    why: str
    slow: bool = False  # marked slow in tests/onnx2jax/test_zoo.py


CASES = {
    "mistral": Case(8, (5, 0), "2 blocks x (attention out + MLP down) + token embedding"),
    "qwen2": Case(8, (5, 0), "2 blocks x 2 + token embedding (tied with the head)"),
    "gpt2": Case(8, (5, 0), "2 blocks x 2 + token embedding (tied); positions replicated"),
    "gpt_neox": Case(
        8, (3, 0), "2 blocks x 1 (parallel residual: the attention and MLP partial sums are "
        "added before they meet, one all-reduce per block) + token embedding"
    ),
    "phi3": Case(8, (5, 0), "2 blocks x 2 + token embedding"),
    "gpt_bigcode": Case(8, (5, 0), "2 blocks x 2 + token embedding (tied); positions replicated"),
    "qwen2_moe": Case(
        8, (5, 0), "2 blocks x (attention out + shared expert down) + embedding; the routed "
        "experts' 3-D weights (gathered per token by batched_mm) are not linears the plan "
        "splits: they stay replicated, no collective", slow=True
    ),
    "roberta": Case(8, (5, 0), "2 blocks x 2 + word embedding; positions/types replicated"),
    "t5": Case(
        8, (11, 0), "encoder 2 x 2 + decoder 2 x 3 (self, cross, FFN) + the shared embedding "
        "read twice: 12 partial sums, of which XLA's combiner merges two independent ones "
        "(the decoder's lookup and one of the encoder) into one tuple all-reduce", slow=True
    ),
    "vit": Case(8, (4, 0), "2 blocks x 2; patch conv and classifier replicated"),
    "wav2vec2": Case(8, (4, 0), "2 blocks x 2; convolutional front end replicated"),
    "whisper_encoder": Case(8, (4, 0), "2 blocks x 2; the Conv1d front end replicated"),
    "resnet": Case(
        8, (2, 0), "2 basic blocks x (conv -> ReLU -> conv, channel-parallel: one all-reduce); "
        "the stem conv (read by the block and its residual) and the strided shortcut conv "
        "(meets the residual Add) left whole, as the classifier"
    ),
    "convnext": Case(8, (2, 0), "2 blocks x (pointwise Linear up -> Linear down)"),
}
