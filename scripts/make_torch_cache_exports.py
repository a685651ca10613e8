"""Torch exports of decoder LLMs with their KV cache (issue 28): a tiny 12-head GPT-2 fixture, and the real-size
models ``bench/real_size.py`` generates with.

- ``--fixture``: ``tests/data/genai/gpt2_torch_12heads/model.onnx``, a 2-layer GPT-2 (width 96, 12 heads of 8,
  vocabulary 512, 128 positions, seed 28, random weights), so that tensor-parallel generation meets heads that
  8 devices do not divide. Its test compares with onnxruntime's greedy loop, computed in the test.
- ``--real-size DIR``: ``DIR/gpt2_cache/model.onnx`` (GPT-2 small's shape: 12 layers, width 768, 12 heads,
  vocabulary 50,257, 1,024 positions, tied head; ~500 MB) and ``DIR/llama_cache/model.onnx`` (a ~336M Llama:
  24 layers, width 1,024, 16 heads, 4 KV heads, MLP 2,816, vocabulary 32,000; ~1.34 GB), weights in external
  data (``model.onnx.data``), random weights (seed 0). Never committed (bench/models/ is ignored).

Each is ``torch.onnx.export(dynamo=True, opset 18)`` of a wrapper that passes the cache as flat tensors
(``past_key_values.N.key/value`` in, ``present.N.key/value`` out), the layout transformers' exports have.

It needs torch and transformers, which onnx2jax never needs: a separate virtualenv (not
``--system-site-packages``), CPU-only torch first::

    python -m venv /work/venvs/spine
    /work/venvs/spine/bin/pip install torch==2.13.0     # the CPU wheel on these machines
    /work/venvs/spine/bin/pip install transformers onnx onnxscript numpy
    /work/venvs/spine/bin/python scripts/make_torch_cache_exports.py --fixture
    /work/venvs/spine/bin/python scripts/make_torch_cache_exports.py --real-size bench/models/real_size

Made with torch 2.13.0+cpu, transformers 5.24.0, onnx 1.23.2, onnxscript 0.7.2.
"""

from __future__ import annotations

import argparse
import gc
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "genai" / "gpt2_torch_12heads"


def gpt2(layers: int, width: int, heads: int, vocab: int, positions: int, seed: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab,
                                     n_positions=positions, bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model = transformers.GPT2LMHeadModel(config).eval()
    if layers == 2:  # the fixture: weights away from ties, so that greedy choices are not near-equal
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.15) if p.dim() > 1 else p.uniform_(0.5, 1.5)
    return model


def llama(seed: int) -> Any:
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        num_hidden_layers=24, hidden_size=1024, num_attention_heads=16, num_key_value_heads=4,
        intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
        pad_token_id=3, tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(config).eval()


def export_with_cache(model: Any, path: Path, external: bool) -> None:
    """torch.onnx.export (dynamo) of a causal LM with flat past/present tensors, ``layers`` of them each."""
    import torch
    import transformers

    cfg = model.config
    layers = cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    head_size = cfg.hidden_size // heads

    class Wrapper(torch.nn.Module):
        def __init__(self, lm: Any) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, attention_mask, position_ids, *past):  # noqa: ANN001
            cache = transformers.DynamicCache(config=self.lm.config)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          past_key_values=cache, use_cache=True)
            presents = []
            for layer in out.past_key_values.layers:
                presents += [layer.keys, layer.values]
            return (out.logits, *presents)

    batch, seq, past_len = 2, 3, 4
    args = (
        torch.randint(4, cfg.vocab_size, (batch, seq)),
        torch.ones(batch, past_len + seq, dtype=torch.int64),
        torch.arange(past_len, past_len + seq)[None].expand(batch, seq),
        *[torch.randn(batch, kv, past_len, head_size) for _ in range(2 * layers)],
    )
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    names_out = ["logits", *[n.replace("past_key_values", "present") for n in past_names]]
    dyn = torch.export.Dim.DYNAMIC
    dynamic = {  # by the wrapper's arguments (its past is one varargs argument)
        "input_ids": {0: dyn, 1: dyn},
        "attention_mask": {0: dyn, 1: dyn},
        "position_ids": {0: dyn, 1: dyn},
        "past": tuple({0: dyn, 2: dyn} for _ in past_names),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            Wrapper(model).eval(), args, input_names=["input_ids", "attention_mask", "position_ids", *past_names],
            output_names=names_out, dynamic_shapes=dynamic, opset_version=18, dynamo=True,
        )
    program.save(str(path), external_data=external)
    import onnx

    exported = onnx.load(str(path), load_external_data=False)
    for node in exported.graph.node:  # torch's stack traces name this machine's paths
        kept = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(kept)
    onnx.save(exported, str(path))  # the external data references are kept as they are


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fixture", action="store_true", help=f"make {FIXTURE.relative_to(ROOT)}")
    parser.add_argument("--real-size", metavar="DIR", help="make DIR/gpt2_cache and DIR/llama_cache")
    parser.add_argument("--only", choices=["gpt2", "llama"], help="with --real-size: only this one")
    args = parser.parse_args()
    if args.fixture:
        export_with_cache(gpt2(2, 96, 12, 512, 128, seed=28), FIXTURE / "model.onnx", external=False)
        print(FIXTURE / "model.onnx", os.path.getsize(FIXTURE / "model.onnx"))
    if args.real_size:
        folder = Path(args.real_size)
        for name, make in (("gpt2", lambda: gpt2(12, 768, 12, 50257, 1024, seed=0)), ("llama", lambda: llama(0))):
            if args.only and args.only != name:
                continue
            path = folder / f"{name}_cache" / "model.onnx"
            if path.exists():
                print(path, "exists")
                continue
            model = make()
            export_with_cache(model, path, external=True)
            del model
            gc.collect()
            print(path, os.path.getsize(str(path) + ".data"))


if __name__ == "__main__":
    main()
