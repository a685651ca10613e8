"""Make the zoo: tiny random transformers architectures exported to ONNX, in tests/data/zoo/.

Needs torch and transformers, which the library itself does not (use a separate venv):

    pip install torch==2.13.0 transformers onnxscript onnx onnxruntime numpy
    python scripts/make_zoo.py                 # every model, rewrites tests/data/zoo/README.md
    python scripts/make_zoo.py qwen2 resnet    # some of them (the README is left alone)

Writes, for each zoo model NAME:

    tests/data/zoo/NAME.onnx              torch.onnx.export(dynamo=True, opset 18), weights inline
    tests/data/zoo/NAME.inputs.npz        one input set (seeded)
    tests/data/zoo/NAME.ort_outputs.npz   onnxruntime's outputs for it (CPU, 1 thread)

and tests/data/zoo/README.md: per model its source class, config, what it is in the zoo
for, its op histogram and its weight matrices.

Every model is a transformers class built from a tiny config object in code, with random
weights (`torch.manual_seed`); nothing is downloaded. As in scripts/make_fixtures.py,
every constant-initialised parameter (norm weights of ones, zero biases) is perturbed so
that each parameter is its own initializer (torch's optimizer deduplicates equal
constants), except in the three `*_shared` encoders, which keep those shared initializers
as an export of a freshly initialised model has them, and the per-node `pkg.torch.onnx.stack_trace` metadata is dropped (machine
paths). Batch and sequence (or audio length) are symbolic in every export; images have a
fixed size and a symbolic batch. The script checks onnx.checker (full), onnxruntime
against torch within 1e-4 on the saved inputs and on a second shape.

The architectures cover what a tensor-parallel plan meets in the wild: grouped-query
attention (Mistral, Qwen2 with two key/value heads and a tied head), fused q/k/v as one
Gemm (GPT-2), behind a Reshape with a per-head interleaved [heads, 3, head_dim] layout
(GPT-NeoX/Pythia), as unequal Slices (Phi-3 under GQA, with a fused gate/up; GPT-BigCode
under multi-query attention), an encoder (RoBERTa), an encoder-decoder with
cross-attention (T5), a vision transformer (ViT), a speech encoder with a convolutional
front end (Wav2Vec2), a speech encoder with a Conv1d front end (Whisper's encoder), a mixture-of-experts decoder (Qwen2-MoE) and two CNNs (ResNet,
ConvNeXt).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (  # noqa: E402  (helpers shared with the transformer fixtures)
    _distinct_params,
    _strip_machine_metadata,
    check_names,
    describe,
    max_diff,
    save_npz,
    weight_table,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = os.path.join(ROOT, "tests", "data", "zoo")
TOL = 1e-4
MAX_SEQ = 64


def _ids(vocab):
    def make(batch, seq, g):
        return torch.randint(0, vocab, (batch, seq), generator=g)

    return make


def _mask(batch, seq, g):
    mask = torch.ones(batch, seq, dtype=torch.int64)
    if batch > 1:  # right-padding on the last sequence
        mask[-1, seq - seq // 4 :] = 0
    return mask


def _lm(cls_name, cfg_name, purpose, seed, **cfg):
    """A causal LM taking input_ids [batch, seq] and returning logits."""

    def build():
        import transformers

        config = getattr(transformers, cfg_name)(
            use_cache=False, attn_implementation="eager", **cfg
        )
        torch.manual_seed(seed)
        model = getattr(transformers, cls_name)(config).eval()
        _distinct_params(model, seed + 100)
        return dict(
            model=model,
            config=config,
            source=f"transformers.{cls_name}",
            purpose=purpose,
            inputs={"input_ids": (_ids(config.vocab_size), {0: "batch", 1: "seq"})},
            kwargs=dict(use_cache=False),
            out_attrs=["logits"],
            shape=(2, 16),
            shape2=(3, 7),
        )

    return build


def _text_config(**extra):
    base = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=8, max_position_embeddings=MAX_SEQ)
    base.update(extra)
    return base


MODELS = {
    "mistral": _lm(
        "MistralForCausalLM", "MistralConfig",
        "grouped-query attention (8 query heads, 4 key/value heads), SiLU-gated MLP, untied head",
        1, **_text_config(num_key_value_heads=4, tie_word_embeddings=False, sliding_window=None),
    ),
    "qwen2": _lm(
        "Qwen2ForCausalLM", "Qwen2Config",
        "GQA with 2 key/value heads (fewer than 4 or 8 devices: key/value replicas), q/k/v "
        "biases, tied embedding/LM head (a Transpose of the table)",
        2, **_text_config(num_key_value_heads=2, tie_word_embeddings=True),
    ),
    "gpt2": _lm(
        "GPT2LMHeadModel", "GPT2Config",
        "fused q/k/v as one Conv1D (Gemm [64,192]) split in equal thirds; tied head; learned "
        "position embeddings",
        3, vocab_size=256, n_positions=MAX_SEQ, n_embd=64, n_layer=2, n_head=8,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=True, bos_token_id=255, eos_token_id=255,
    ),
    "gpt_neox": _lm(
        "GPTNeoXForCausalLM", "GPTNeoXConfig",
        "Pythia: fused query_key_value behind a Reshape [B,S,heads,3*head_dim] (per-head "
        "interleaved q/k/v), partial rotary, parallel residual",
        4, **_text_config(rotary_pct=0.5, use_parallel_residual=True, tie_word_embeddings=False,
                          hidden_dropout=0.0, attention_dropout=0.0),
    ),
    "phi3": _lm(
        "Phi3ForCausalLM", "Phi3Config",
        "fused qkv_proj cut by three unequal Slices under GQA (q 64, k 32, v 32 wide) and a "
        "fused gate_up_proj chunked in two",
        5, **_text_config(num_key_value_heads=4, tie_word_embeddings=False, pad_token_id=0,
                          original_max_position_embeddings=MAX_SEQ),
    ),
    "gpt_bigcode": _lm(
        "GPTBigCodeForCausalLM", "GPTBigCodeConfig",
        "multi-query attention: fused c_attn [64, 64+8+8] cut into unequal q|k|v, one "
        "key/value head (replicated), tied head",
        6, vocab_size=256, n_positions=MAX_SEQ, n_embd=64, n_layer=2, n_head=8,
        multi_query=True, activation_function="gelu_pytorch_tanh", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=255,
        eos_token_id=255,
    ),
    "qwen2_moe": _lm(
        "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
        "mixture of experts: 4 experts, top-2 routing (TopK), a shared expert with a sigmoid "
        "gate; experts_implementation='batched_mm' (each token gathers its experts' weights: "
        "static shapes)",
        7, **_text_config(num_key_value_heads=4, tie_word_embeddings=False, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=64, decoder_sparse_step=1,
                          norm_topk_prob=True, mlp_only_layers=[],
                          experts_implementation="batched_mm"),
    ),
}


def _roberta():
    from transformers import RobertaConfig, RobertaModel

    config = RobertaConfig(**_text_config(max_position_embeddings=MAX_SEQ + 2), type_vocab_size=1,
                           hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                           pad_token_id=1, attn_implementation="eager")
    torch.manual_seed(8)
    model = RobertaModel(config, add_pooling_layer=True).eval()
    _distinct_params(model, 108)

    def ids(batch, seq, g):  # no padding token inside the sequences
        return torch.randint(2, config.vocab_size, (batch, seq), generator=g)

    return dict(
        model=model, config=config, source="transformers.RobertaModel (add_pooling_layer=True)",
        purpose="encoder: bidirectional attention with a padding mask, position ids from a "
                "CumSum over non-padding tokens, token-type and position embeddings, pooler",
        inputs={"input_ids": (ids, {0: "batch", 1: "seq"}),
                "attention_mask": (_mask, {0: "batch", 1: "seq"})},
        kwargs={}, out_attrs=["last_hidden_state", "pooler_output"], shape=(2, 16), shape2=(3, 7),
    )


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(vocab_size=256, d_model=64, d_kv=8, d_ff=128, num_layers=2,
                      num_decoder_layers=2, num_heads=8, relative_attention_num_buckets=8,
                      relative_attention_max_distance=32, dropout_rate=0.0,
                      feed_forward_proj="relu", tie_word_embeddings=True, use_cache=False,
                      decoder_start_token_id=0, pad_token_id=0, attn_implementation="eager")
    torch.manual_seed(9)
    model = T5ForConditionalGeneration(config).eval()
    _distinct_params(model, 109)
    return dict(
        model=model, config=config, source="transformers.T5ForConditionalGeneration",
        purpose="encoder-decoder: self- and cross-attention, relative position bias, shared "
                "tied embedding (encoder, decoder and LM head)",
        inputs={"input_ids": (_ids(256), {0: "batch", 1: "seq"}),
                "attention_mask": (_mask, {0: "batch", 1: "seq"}),
                "decoder_input_ids": (_ids(256), {0: "batch", 1: "tgt_seq"})},
        kwargs=dict(use_cache=False), out_attrs=["logits"], shape=(2, 16), shape2=(3, 7),
    )


def _vit(heads=8, distinct=True):
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=64,
                       num_hidden_layers=2, num_attention_heads=heads, intermediate_size=128,
                       hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, num_labels=10,
                       attn_implementation="eager")
    torch.manual_seed(10)
    model = ViTForImageClassification(config).eval()
    if distinct:
        _distinct_params(model, 110)
    return dict(
        model=model, config=config, source="transformers.ViTForImageClassification",
        purpose="vision transformer: Conv patch embedding (stride = kernel), class token, "
                "learned positions, classifier on the class token",
        inputs={"pixel_values": (_image(3, 32), {0: "batch"})},
        kwargs={}, out_attrs=["logits"], shape=(2,), shape2=(3,),
    )


def _image(channels, size):
    def make(batch, g):
        return torch.randn(batch, channels, size, size, generator=g)

    return make


def _wav2vec2(heads=8, distinct=True):
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    config = Wav2Vec2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=heads,
                            intermediate_size=128, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2),
                            conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=8, feat_extract_norm="group",
                            do_stable_layer_norm=False, hidden_dropout=0.0,
                            attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0,
                            layerdrop=0.0, mask_time_prob=0.0, apply_spec_augment=False,
                            attn_implementation="eager")
    torch.manual_seed(11)
    model = Wav2Vec2Model(config).eval()
    if distinct:
        _distinct_params(model, 111)

    def audio(batch, length, g):
        return torch.randn(batch, length, generator=g)

    return dict(
        model=model, config=config, source="transformers.Wav2Vec2Model",
        purpose="speech encoder: 1-D convolutional feature extractor (GroupNorm), a grouped "
                "convolutional position embedding (8 groups), transformer encoder",
        inputs={"input_values": (audio, {0: "batch", 1: "samples"})},
        kwargs={}, out_attrs=["last_hidden_state"], shape=(2, 400), shape2=(3, 240),
    )


def _whisper_encoder(heads=8, distinct=True):
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2,
                           encoder_attention_heads=heads, encoder_ffn_dim=128,
                           max_source_positions=16, dropout=0.0, attention_dropout=0.0,
                           activation_dropout=0.0, encoder_layerdrop=0.0,
                           attn_implementation="eager")
    torch.manual_seed(14)
    model = WhisperEncoder(config).eval()
    if distinct:
        _distinct_params(model, 114)

    def features(batch, g):  # the encoder takes exactly 2 * max_source_positions frames
        return torch.randn(batch, 16, 32, generator=g)

    return dict(
        model=model, config=config, source="transformers.WhisperEncoder",
        purpose="speech encoder: two Conv1d + GELU front end (the second strided), "
                "sinusoidal positions, pre-norm transformer blocks, final LayerNorm",
        inputs={"input_features": (features, {0: "batch"})},
        kwargs={}, out_attrs=["last_hidden_state"], shape=(2,), shape2=(3,),
    )


def _resnet():
    from transformers import ResNetConfig, ResNetForImageClassification

    config = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32],
                          depths=[1, 1], layer_type="basic", hidden_act="relu", num_labels=10)
    torch.manual_seed(12)
    model = ResNetForImageClassification(config).eval()
    _distinct_params(model, 112)
    _random_bn_stats(model, 212)
    return dict(
        model=model, config=config, source="transformers.ResNetForImageClassification",
        purpose="CNN: Conv + BatchNormalization + ReLU, MaxPool, strided shortcut convs, "
                "global average pool, classifier",
        inputs={"pixel_values": (_image(3, 32), {0: "batch"})},
        kwargs={}, out_attrs=["logits"], shape=(2,), shape2=(3,),
    )


def _convnext():
    from transformers import ConvNextConfig, ConvNextForImageClassification

    config = ConvNextConfig(num_channels=3, patch_size=4, hidden_sizes=[16, 32], depths=[1, 1],
                            num_stages=2, drop_path_rate=0.0, num_labels=10, image_size=32)
    torch.manual_seed(13)
    model = ConvNextForImageClassification(config).eval()
    _distinct_params(model, 113)
    return dict(
        model=model, config=config, source="transformers.ConvNextForImageClassification",
        purpose="CNN: patchify conv, depthwise 7x7 convs (groups = channels), channels-last "
                "LayerNorm and pointwise Linear layers, layer scale",
        inputs={"pixel_values": (_image(3, 32), {0: "batch"})},
        kwargs={}, out_attrs=["logits"], shape=(2,), shape2=(3,),
    )


def _random_bn_stats(model, seed):
    """Give BatchNorm layers non-trivial running statistics (fresh ones are 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=g))
            m.running_var.copy_(1 + 0.1 * torch.rand(m.running_var.shape, generator=g))


def _shared(build, what):
    """``build``'s encoder with 4 heads and the initialisation transformers gives it (issue 41's exports)."""

    def make():
        spec = build(heads=4, distinct=False)
        spec["purpose"] = (
            f"{what} with 4 heads and transformers' own initialisation kept: the exporter folds the equal "
            "constants into shared initializers (one [64] of zeros is every q/k/v bias, output bias and "
            "LayerNorm bias; one of ones every LayerNorm weight), so a parameter feeds column-split "
            "biases and LayerNorms alike, the first of which no spec reaches from the front end"
        )
        return spec

    return make


MODELS.update(roberta=_roberta, t5=_t5, vit=_vit, wav2vec2=_wav2vec2,
              whisper_encoder=_whisper_encoder, resnet=_resnet, convnext=_convnext,
              vit_shared=_shared(_vit, "ViT"), wav2vec2_shared=_shared(_wav2vec2, "Wav2Vec2"),
              whisper_encoder_shared=_shared(_whisper_encoder, "Whisper's encoder"))


class Wrapper(torch.nn.Module):
    """Calls a transformers model with named positional inputs; returns a tuple of outputs."""

    def __init__(self, model, names, kwargs, out_attrs):
        super().__init__()
        self.model = model
        self._names = names
        self._kwargs = kwargs
        self._out_attrs = out_attrs

    def forward(self, *args):
        out = self.model(**dict(zip(self._names, args)), **self._kwargs)
        return tuple(getattr(out, a) for a in self._out_attrs)


def make_inputs(spec, shape, seed):
    g = torch.Generator().manual_seed(seed)
    return {name: make(*shape, g) for name, (make, _) in spec["inputs"].items()}


def export(spec, opset):
    names = list(spec["inputs"])
    wrapper = Wrapper(spec["model"], names, spec["kwargs"], spec["out_attrs"]).eval()
    example = make_inputs(spec, spec["shape"], 0)
    dims = {}
    maxes = {"batch": 1024, "seq": MAX_SEQ, "tgt_seq": MAX_SEQ, "samples": 16000}
    dynamic = tuple(
        {ax: dims.setdefault(n, torch.export.Dim(n, min=2, max=maxes[n])) for ax, n in axes.items()}
        for _, axes in spec["inputs"].values()
    )
    log = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(log), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            wrapper, tuple(example[n] for n in names), dynamo=True, opset_version=opset,
            external_data=False, input_names=names, output_names=list(spec["out_attrs"]),
            dynamic_shapes=(dynamic,),  # forward(*args): one entry, a tuple
        )
    proto = prog.model_proto
    _strip_machine_metadata(proto)
    return proto


def run_torch(spec, inputs):
    names = list(spec["inputs"])
    wrapper = Wrapper(spec["model"], names, spec["kwargs"], spec["out_attrs"]).eval()
    with torch.no_grad():
        outs = wrapper(*(inputs[n] for n in names))
    return {n: o.detach().numpy() for n, o in zip(spec["out_attrs"], outs)}


def run_ort(path, inputs):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, {k: v.numpy() for k, v in inputs.items()})))


def make(name, out, opset):
    spec = MODELS[name]()
    path = os.path.join(out, f"{name}.onnx")
    proto = export(spec, opset)
    check_names(proto)
    onnx.save(proto, path)
    onnx.checker.check_model(path, full_check=True)
    inputs = make_inputs(spec, spec["shape"], 0)
    got = run_ort(path, inputs)
    diff = max_diff(run_torch(spec, inputs), got)
    inputs2 = make_inputs(spec, spec["shape2"], 1)
    diff2 = max_diff(run_torch(spec, inputs2), run_ort(path, inputs2))
    print(f"{name}: {os.path.getsize(path)} bytes, {len(proto.graph.node)} nodes, "
          f"max |torch - ort| = {diff:.2e} {spec['shape']}, {diff2:.2e} {spec['shape2']}")
    assert diff < TOL and diff2 < TOL, (name, diff, diff2)
    save_npz(os.path.join(out, f"{name}.inputs.npz"), {k: v.numpy() for k, v in inputs.items()})
    save_npz(os.path.join(out, f"{name}.ort_outputs.npz"), got)
    d = describe(proto)
    d.update(name=name, spec=spec, size=os.path.getsize(path), diff=diff, diff2=diff2,
             weights=weight_table(proto),
             in_shapes={k: list(v.shape) for k, v in inputs.items()})
    return d


def readme(summaries, failures) -> str:
    L = []
    w = L.append
    w("# tests/data/zoo: tiny exports of common architectures\n")
    w("Generated by `scripts/make_zoo.py`; do not edit by hand. To regenerate (in a venv "
      "separate from the library's):\n")
    w("```sh\npip install torch==2.13.0 transformers onnxscript onnx onnxruntime numpy\n"
      "python scripts/make_zoo.py\n```\n")
    w(f"Made with torch {torch.__version__}, transformers {_version('transformers')}, onnx "
      f"{onnx.__version__}, onnxscript {_version('onnxscript')}, onnxruntime {ort.__version__}; "
      "`torch.onnx.export(dynamo=True)`, opset 18, weights inline, symbolic batch and sequence "
      "(images: symbolic batch, fixed 32x32). Configs are built in code with random weights "
      "(nothing downloaded); constant-initialised parameters are perturbed so that no two "
      "parameters share an initializer, except in the `*_shared` encoders. `NAME.inputs.npz` is one seeded input set, "
      "`NAME.ort_outputs.npz` onnxruntime's outputs for it (CPU, 1 thread); onnxruntime "
      "matches torch within 1e-4 on it and on a second shape.\n")
    w("`tests/onnx2jax/test_zoo.py` runs each model sharded with the Megatron plan on 8 fake "
      "devices against these outputs. `tests/onnx2jax/test_zoo_tpu.py` runs the `*_shared` "
      "encoders at TP 4 (hand and automatic plans) and compiles the zoo for a TPU (v5e:2x4).\n")
    w("| model | source | for | size | nodes | parameters |\n| --- | --- | --- | --- | --- | --- |")
    for d in summaries:
        w(f"| {d['name']} | `{d['spec']['source']}` | {d['spec']['purpose']} | "
          f"{d['size'] / 1024:.0f} KiB | {d['n_nodes']} | {d['n_params']:,} |")
    if failures:
        w("\nArchitectures tried and left out:\n")
        for name, why in failures.items():
            w(f"- **{name}**: {why}")
    for d in summaries:
        spec = d["spec"]
        w(f"\n## {d['name']}.onnx\n")
        w(f"- source: `{spec['source']}`, eval mode; {spec['purpose']}")
        cfg = spec["config"].to_diff_dict()
        cfg = {k: v for k, v in cfg.items() if k not in ("transformers_version", "architectures",
                                                          "id2label", "label2id")}
        w(f"- config (differences from the class defaults): `{cfg}`")
        w(f"- {d['size']} bytes; {d['n_nodes']} nodes; {d['n_init']} initializers "
          f"({d['n_params']} elements); max |torch - onnxruntime| {d['diff']:.2e}, {d['diff2']:.2e}")
        w("- inputs: " + ", ".join(f"`{n}` {t} {s} (npz {d['in_shapes'][n]})"
                                    for n, s, t in d["inputs"]))
        w("- outputs: " + ", ".join(f"`{n}` {t} {s}" for n, s, t in d["outputs"]))
        w("- ops: " + ", ".join(f"{op} {c}" for (_, op), c in d["hist"]))
        if d["weights"]:
            w("\n| node | op | weight | shape | torch module |\n| --- | --- | --- | --- | --- |")
            for node, op, init, shape, module in d["weights"]:
                w(f"| {node} | {op} | {init} | {shape} | {module} |")
    return "\n".join(L) + "\n"


# Architectures tried and not in the zoo, with the reason (written into the README).
LEFT_OUT: dict[str, str] = {
    "qwen2_moe with the default experts implementation": (
        "transformers' default `grouped_mm` experts call a custom op "
        "(`transformers::grouped_mm_fallback`) that torch's ONNX exporter cannot translate, and "
        "the `eager` one loops over the experts hit, with `nonzero`/`torch.where` (data-dependent "
        "shapes); `batched_mm` gathers each token's expert weights and exports with static shapes, "
        "so the zoo uses it"),
}


def _version(name):
    from importlib.metadata import version

    return version(name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--out", default=ZOO)
    ap.add_argument("names", nargs="*", default=list(MODELS))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    summaries = [make(name, args.out, args.opset) for name in args.names]
    if sorted(args.names) == sorted(MODELS) and os.path.abspath(args.out) == os.path.abspath(ZOO):
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(readme(summaries, LEFT_OUT))
        print(f"wrote {os.path.join(args.out, 'README.md')}")


if __name__ == "__main__":
    sys.exit(main())
