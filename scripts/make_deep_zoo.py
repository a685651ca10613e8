"""Deeper copies of zoo transformers (mistral, gpt2) for bench/bench_scan.py: same configs, more layers.

Uses scripts/make_zoo.py's builders and exporter (torch dynamo, opset 18, symbolic batch and seq),
so run it in the fixture venv (torch is not a dependency of onnx2jax). Nothing is committed:

    /work/fixvenv/bin/python scripts/make_deep_zoo.py --layers 2 8 32 --out /tmp/deep_zoo
    python bench/bench_scan.py /tmp/deep_zoo/mistral_32.onnx ...
"""

from __future__ import annotations

import argparse
import os
import sys

import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_zoo  # noqa: E402


def spec(name: str, layers: int):
    if name == "mistral":
        return make_zoo._lm(
            "MistralForCausalLM", "MistralConfig", "mistral, deeper", 1,
            **make_zoo._text_config(num_key_value_heads=4, tie_word_embeddings=False, sliding_window=None,
                                    num_hidden_layers=layers),
        )()
    if name == "gpt2":
        return make_zoo._lm(
            "GPT2LMHeadModel", "GPT2Config", "gpt2, deeper", 3, vocab_size=256, n_positions=make_zoo.MAX_SEQ,
            n_embd=64, n_layer=layers, n_head=8, activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, tie_word_embeddings=True, bos_token_id=255, eos_token_id=255,
        )()
    raise SystemExit(f"unknown model {name!r} (mistral, gpt2)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mistral", "gpt2"])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 8, 32])
    parser.add_argument("--out", default="/tmp/deep_zoo")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    for name in args.models:
        for layers in args.layers:
            s = spec(name, layers)
            proto = make_zoo.export(s, 18)
            path = os.path.join(args.out, f"{name}_{layers}.onnx")
            onnx.save(proto, path)
            inputs = make_zoo.make_inputs(s, s["shape"], 0)
            diff = make_zoo.max_diff(make_zoo.run_torch(s, inputs), make_zoo.run_ort(path, inputs))
            print(f"{path}: {len(proto.graph.node)} nodes, max |torch - onnxruntime| {diff:.2e}", flush=True)


if __name__ == "__main__":
    main()
