"""Tensor-parallel Llama, end to end: export with torch -> annotate -> compile on 8 devices -> compare.

Needs torch and transformers besides onnx2jax (they are not dependencies of
the library):

    pip install torch==2.13.0 transformers onnxscript
    python examples/tensor_parallel_llama.py [--layers 2] [--hidden 128]

The model is a transformers LlamaForCausalLM built from a small config with
random weights (nothing is downloaded): grouped-query attention, RoPE,
RMSNorm and a SiLU-gated MLP. It is exported with torch.onnx (dynamo),
annotated with the Megatron plan for 8 devices, compiled for 8 fake CPU
devices, and compared with both torch and the unsharded onnx2jax run.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import jax

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

import onnx2jax  # noqa: E402
from sharding.annotate import describe_plan  # noqa: E402
from sharding.megatron import megatron_plan  # noqa: E402


class LogitsOnly(torch.nn.Module):
    """Returns a plain tensor, so the export has one output."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


def export_llama(path: pathlib.Path, layers: int, hidden: int) -> tuple[torch.nn.Module, onnx.ModelProto]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=128,
        attn_implementation="eager",
        use_cache=False,
    )
    model = LogitsOnly(LlamaForCausalLM(config).eval())
    example = torch.zeros((2, 16), dtype=torch.int64)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    torch.onnx.export(
        model,
        (example,),
        str(path),
        dynamo=True,
        opset_version=18,
        external_data=False,
        input_names=["input_ids"],
        output_names=["logits"],
        dynamic_shapes={"input_ids": {0: batch, 1: seq}},
    )
    return model, onnx.load(str(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        torch_model, proto = export_llama(pathlib.Path(tmp) / "llama.onnx", args.layers, args.hidden)
    annotated = megatron_plan(proto, 8)
    for row in describe_plan(annotated)[:12]:
        print(row)
    compiled = onnx2jax.compile(annotated)
    input_ids = np.random.default_rng(0).integers(0, 512, (2, 24)).astype(np.int64)
    (sharded,) = compiled(input_ids)
    (unsharded,) = onnx2jax.translate(proto)(input_ids)
    with torch.no_grad():
        reference = torch_model(torch.from_numpy(input_ids)).numpy()
    compiled.report().render()
    print(f"max |sharded - unsharded| = {np.abs(np.asarray(sharded) - np.asarray(unsharded)).max():.3g}")
    print(f"max |sharded - torch|     = {np.abs(np.asarray(sharded) - reference).max():.3g}")


if __name__ == "__main__":
    main()
