"""TPU targets compiled ahead of time on a CPU machine (issue 41's Goals): memory, time, collectives.

Makes Llama-shaped decoders on demand (never committed): bf16 weights in a *sparse* external-data file
(``truncate``: nothing written, and a target compile never reads it), the graph
``bench/medium_transformers.py``'s Llama (the exporter's causal mask, rotary, grouped-query attention)
with every float in bf16. Each invocation measures one configuration in its own process (``--fresh``: in a
child process, its JSON printed); its host peak RSS is ``VmHWM``.

Configurations (``--run``):

- ``tiny``: a 2-layer, width-64 decoder at TP 8 on v5e:2x4 (the light test runs it);
- ``8b``: Llama-3-8B's shape (hidden 4096, 32 layers, 32/8 heads, FFN 14336, vocabulary 128256), Megatron
  plan at TP 8, layers scanned, on v5e:2x4, prefill at [1, 2048] (``--shape`` to change);
- ``70b``: Llama-3-70B's shape (hidden 8192, 80 layers, 64/8 heads, FFN 28672) under the automatic plan on
  v5p:4x4x4 (64 devices; ``--mesh data,tensor`` to search one mesh shape only);
- ``multislice``: two slices of v5e:2x4, data parallel across them (``--model small``: 2 layers, width
  1024): a gradient step's DCN bytes against the parameter bytes of one replica;
- ``refuse``: a configuration that does not fit (``--model 70b``: Llama-3-70B's shape on the 8 chips of a
  v5e:2x4), refused by the automatic plan's ``MemoryLimitError`` before anything is compiled.

    python bench/tpu_targets.py --run 8b --shape 1,2048 --fresh
    python bench/tpu_targets.py --run 70b --shape 1,2048 --fresh
    python bench/tpu_targets.py --run multislice --model small --shape 4,128 --fresh
    python bench/tpu_targets.py --run refuse --model 70b --shape 1,2048

The analytic per-chip count for a prefill at [B, S] (TP t, bf16, 2 bytes; :func:`analytic_peak`): weights / t
for the split matrices (projections, embedding, head) plus the norms whole; plus one scanned layer's widest
activations, the larger of the [B, heads/t, S, S] attention scores (fp32) with their bf16 probabilities and
the [B, S, FFN/t] gate, up and product, plus the residual stream in and out [B, S, width]; plus the output
logits [B, S, vocab/t]. No cache: this graph takes none and returns only the logits.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]  # this checkout's onnx2jax, not an installed one
import medium_transformers as mt  # noqa: E402

BF16 = 2  # bytes


@dataclasses.dataclass(frozen=True)
class Shape:
    """A Llama's sizes."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    def tag(self) -> str:
        return f"L{self.layers}-W{self.width}-H{self.heads}-KV{self.kv_heads}-F{self.ffn}-V{self.vocab}"


TINY = Shape(layers=2, width=64, heads=8, kv_heads=8, ffn=128, vocab=256)
SMALL = Shape(layers=2, width=1024, heads=8, kv_heads=8, ffn=4096, vocab=8192)
LLAMA3_8B = Shape(layers=32, width=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256)
LLAMA3_70B = Shape(layers=80, width=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256)
SHAPES = {"tiny": TINY, "small": SMALL, "8b": LLAMA3_8B, "70b": LLAMA3_70B}


class _SparseGraph(mt._Graph):
    """medium_transformers' graph builder with bf16 weights held only as external-data references."""

    def __init__(self, location: str) -> None:
        super().__init__(0)
        self.location = location
        self.size = 0

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        offset = self.size + (-self.size % 64)
        length = int(np.prod(shape)) * BF16
        tensor = TensorProto(name=name, data_type=TensorProto.BFLOAT16, dims=list(shape))
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            tensor.external_data.add(key=key, value=value)
        self.inits.append(tensor)
        self.size = offset + length
        return name

    def linear(self, name: str, fan_in: int, fan_out: int, std: float = 0.02) -> str:
        return self.weight(name, (fan_in, fan_out))

    def vector(self, name: str, size: int, center: float, std: float = 0.05) -> str:
        return self.weight(name, (size,))


def _llama(g: _SparseGraph, c: Shape) -> None:
    """medium_transformers' Llama (its helpers, the same nodes) over ``g``'s sparse weights."""
    b1, s1, b, s = mt._batch_and_seq(g)
    x = g.op("Gather", g.weight("embed_tokens", (c.vocab, c.width)), "input_ids", axis=0)
    mask, positions = mt._causal_mask(g, b1, s1, b, s)
    inv_freq = 1.0 / (10000.0 ** (np.arange(0, c.head_dim, 2) / c.head_dim))
    freqs = g.op("Mul", g.op("Cast", g.op("Unsqueeze", positions, g.const([2])), to=TensorProto.FLOAT),
                 g.const(inv_freq, np.float32))
    angles = g.op("Concat", freqs, freqs, axis=-1)
    cos = g.op("Unsqueeze", g.op("Cos", angles), g.const([1]))
    sin = g.op("Unsqueeze", g.op("Sin", angles), g.const([1]))
    config = mt.Config(layers=c.layers, width=c.width, heads=c.heads, kv_heads=c.kv_heads, llama_ffn=c.ffn,
                       vocab=c.vocab)
    kv_width = c.kv_heads * c.head_dim
    for i in range(c.layers):
        p = f"layers.{i}."
        h = mt._rms_norm(g, x, g.vector(p + "input_layernorm", c.width, 1.0))
        q = mt._heads(g, g.op("MatMul", h, g.linear(p + "q_proj", c.width, c.width)), b1, s1, c.head_dim)
        k = mt._heads(g, g.op("MatMul", h, g.linear(p + "k_proj", c.width, kv_width)), b1, s1, c.head_dim)
        v = mt._heads(g, g.op("MatMul", h, g.linear(p + "v_proj", c.width, kv_width)), b1, s1, c.head_dim)
        q, k = mt._rotate(g, q, cos, sin, c.head_dim // 2), mt._rotate(g, k, cos, sin, c.head_dim // 2)
        if c.kv_heads != c.heads:
            k, v = mt._repeat_kv(g, k, config, b1, s1), mt._repeat_kv(g, v, config, b1, s1)
        attn = mt._attend(g, q, g.op("Transpose", k, perm=[0, 1, 3, 2]), v, mask, c.head_dim, b1, s1)
        x = g.op("Add", x, g.op("MatMul", attn, g.linear(p + "o_proj", c.width, c.width)))
        h = mt._rms_norm(g, x, g.vector(p + "post_attention_layernorm", c.width, 1.0))
        gate = g.op("MatMul", h, g.linear(p + "gate_proj", c.width, c.ffn))
        up = g.op("MatMul", h, g.linear(p + "up_proj", c.width, c.ffn))
        act = g.op("Mul", g.op("Mul", gate, g.op("Sigmoid", gate)), up)
        x = g.op("Add", x, g.op("MatMul", act, g.linear(p + "down_proj", c.ffn, c.width)))
    h = mt._rms_norm(g, x, g.vector("norm", c.width, 1.0))
    g.nodes.append(helper.make_node("MatMul", [h, g.linear("lm_head", c.width, c.vocab)], ["logits"], name="lm_head"))


def _to_bf16(g: _SparseGraph) -> None:
    """Every float of the graph in bf16: fp32 constants converted, Casts to float made Casts to bf16."""
    for i, tensor in enumerate(g.inits):
        if tensor.data_type == TensorProto.FLOAT and tensor.data_location != TensorProto.EXTERNAL:
            import ml_dtypes

            array = numpy_helper.to_array(tensor).astype(ml_dtypes.bfloat16)
            converted = helper.make_tensor(tensor.name, TensorProto.BFLOAT16, array.shape,
                                           array.view(np.uint16).flatten().tolist())
            g.inits[i] = converted
    for node in g.nodes:
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.BFLOAT16


def make(name: str, folder: pathlib.Path) -> pathlib.Path:
    """The ``name`` decoder's path in ``folder`` (made first when missing): graph inline, weights a sparse file."""
    shape = SHAPES[name]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"llama-{shape.tag()}-bf16.onnx"
    if path.exists():
        return path
    data = path.with_suffix(".data")
    g = _SparseGraph(data.name)
    _llama(g, shape)
    _to_bf16(g)
    with open(data, "wb") as f:
        f.truncate(g.size)  # sparse: takes no disk, and a compile for a target never opens it
    graph = helper.make_graph(
        g.nodes, f"llama_{shape.tag()}",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.BFLOAT16, ["batch", "seq", shape.vocab])], g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="bench/tpu_targets.py")
    model.ir_version = 10
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)
    return path


def weight_bytes(shape: Shape) -> tuple[int, int]:
    """(all weight bytes, bytes of the weights a Megatron plan splits: the projections, embedding and head)."""
    d, kv, f = shape.width, shape.kv_heads * shape.head_dim, shape.ffn
    matrices = shape.layers * (2 * d * d + 2 * d * kv + 3 * d * f) + 2 * shape.vocab * d
    vectors = (2 * shape.layers + 1) * d
    return (matrices + vectors) * BF16, matrices * BF16


def analytic_peak(shape: Shape, tp: int, batch: int, seq: int) -> dict[str, int]:
    """The per-chip count stated in the module docstring, by part (bytes)."""
    total, split = weight_bytes(shape)
    weights = split // tp + (total - split)
    scores = batch * (shape.heads // tp) * seq * seq * (4 + BF16)  # fp32 scores, bf16 probabilities
    ffn = 3 * batch * seq * (shape.ffn // tp) * BF16
    activations = max(scores, ffn) + 2 * batch * seq * shape.width * BF16  # + the residual in and out
    logits = batch * seq * (shape.vocab // tp) * BF16
    return {"weights": weights, "activations": activations, "logits": logits,
            "total": weights + activations + logits}


def _peak_rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _report_dict(report) -> dict:
    m, cost = report.memory, report.cost
    return {
        "chip": report.chip.name, "chips": report.chips, "slices": report.slices,
        "argument_bytes": m.argument_bytes, "output_bytes": m.output_bytes, "peak_bytes": m.peak_bytes,
        "hbm_bytes": m.hbm_bytes, "fits": m.fits,
        "collectives": {f"{k} {n}": {"count": c, "bytes": b} for (k, n), (c, b) in report.totals().items()},
        "ici_bytes": report.network_bytes("ICI"), "dcn_bytes": report.network_bytes("DCN"),
        "flops": cost.flops, "bytes_accessed": cost.bytes_accessed, "estimate_s": cost.seconds,
        "compiler_estimate_s": cost.compiler_seconds, "roofline_s": cost.roofline_seconds,
        "notes": list(cost.notes), "loops": [list(x) for x in cost.loops],
    }


def run_prefill(name: str, folder: pathlib.Path, target: str, tp: int, batch: int, seq: int) -> dict:
    """Megatron plan at TP ``tp``, layers scanned, compiled for ``target`` at [batch, seq]: the report."""
    import onnx2jax
    from onnx2jax.runtime.tpu_report import compile_and_report
    from sharding.megatron import megatron_plan

    path = make(name, folder)
    started = time.perf_counter()
    planned = folder / f"{path.stem}-tp{tp}.onnx"
    if not planned.exists():
        annotated = megatron_plan(onnx.load(str(path), load_external_data=False), tp)
        planned.write_bytes(annotated.SerializeToString())  # its initializers still point at the sparse file
    planned_s = time.perf_counter() - started
    tpu = onnx2jax.compile(str(planned), target=target, scan_layers=True)
    lowered = tpu.lower((batch, seq))
    lowered_s = time.perf_counter() - started
    _, report = compile_and_report(lowered, tpu.mesh, what=f"{name} prefill [{batch}, {seq}]")
    total_s = time.perf_counter() - started
    shape = SHAPES[name]
    return {
        "run": name, "target": target, "tp": tp, "input": [batch, seq], "scanned": bool(tpu.model.scan.active),
        "plan_s": planned_s, "lower_s": lowered_s - planned_s, "compile_s": total_s - lowered_s, "total_s": total_s,
        "weight_bytes": weight_bytes(shape)[0], "analytic": analytic_peak(shape, tp, batch, seq),
        "report": _report_dict(report),
    }


def run_auto(name: str, folder: pathlib.Path, target: str, batch: int, seq: int,
             mesh: tuple[int, int] | None = None) -> dict:
    """The automatic plan for the target's devices (each device's HBM its limit), compiled for it.

    ``mesh``: (data, tensor) to search within (default: every factorisation of the device count).
    """
    import onnx2jax
    from onnx2jax.runtime import targets
    from onnx2jax.runtime.tpu_report import compile_and_report, device_chip
    from sharding.auto import auto_plan

    path = make(name, folder)
    started = time.perf_counter()
    devices = targets.parse_target(target).devices()
    chip = device_chip(devices)
    searched = {"data": mesh[0], "tensor": mesh[1]} if mesh else len(devices)
    annotated, auto = auto_plan(onnx.load(str(path), load_external_data=False), searched, batch=batch, seq=seq,
                                memory_per_device=chip.hbm_bytes)
    planned = folder / f"{path.stem}-auto{'x'.join(map(str, mesh)) if mesh else len(devices)}.onnx"
    planned.write_bytes(annotated.SerializeToString())
    result = {"run": name, "target": target, "input": [batch, seq], "searched": searched, "plan": auto.winner.name,
              "plan_s": time.perf_counter() - started, "weight_bytes": weight_bytes(SHAPES[name])[0]}
    try:
        tpu = onnx2jax.compile(str(planned), configuration="auto", target=target, scan_layers=True)
        lowered = tpu.lower((batch, seq))
        _, report = compile_and_report(lowered, tpu.mesh, what=f"{name} prefill [{batch}, {seq}]")
    except Exception as error:  # said in the result, with the time it took to fail
        result.update(error=f"{type(error).__name__}: {str(error)[:500]}", total_s=time.perf_counter() - started)
        return result
    result.update(mesh=dict(tpu.mesh.shape), scanned=bool(tpu.model.scan.active),
                  total_s=time.perf_counter() - started, report=_report_dict(report))
    return result


def run_multislice(name: str, folder: pathlib.Path, topology: str, batch: int, seq: int) -> dict:
    """Data parallel across two slices (the automatic plan's mesh fixed to data 2 x tensor n): a gradient step."""
    import jax
    import jax.numpy as jnp

    import onnx2jax
    from onnx2jax.runtime import targets
    from onnx2jax.runtime.tpu_report import compile_and_report
    from sharding.auto import auto_plan

    path = make(name, folder)
    per_slice = len(targets.parse_target(topology).devices())
    annotated, _ = auto_plan(onnx.load(str(path), load_external_data=False), {"data": 2, "tensor": per_slice},
                             batch=batch, seq=seq, memory_per_device=10**12)
    planned = folder / f"{path.stem}-dp2x{per_slice}.onnx"
    planned.write_bytes(annotated.SerializeToString())
    tpu = onnx2jax.compile(str(planned), configuration="auto", target=topology, slices=2)

    def loss(params, ids):
        (logits,) = tpu.apply(params, ids)
        return jnp.mean(logits.astype(jnp.float32) ** 2)

    with jax.enable_x64(True):  # the token ids are int64
        ids = jax.ShapeDtypeStruct((batch, seq), np.int64)
        lowered = jax.jit(jax.grad(loss)).lower(tpu.abstract_params, ids)
    _, report = compile_and_report(lowered, tpu.mesh, what=f"{name} gradient step")
    params = sum(int(np.prod(p.shape)) * np.dtype(p.dtype).itemsize for p in jax.tree.leaves(tpu.abstract_params))
    return {"run": "multislice", "target": f"{topology} x2 slices", "input": [batch, seq],
            "mesh": dict(tpu.mesh.shape), "param_bytes_per_replica": params,
            "dcn_bytes_per_slice": report.bytes_per_slice("DCN"),
            "dcn_all_reduce_bytes": sorted(c.bytes for c in report.collectives
                                           if c.network == "DCN" and c.kind == "all-reduce"),
            "report": _report_dict(report)}


def run_refuse(name: str, folder: pathlib.Path, target: str, batch: int, seq: int,
               memory_per_device: int | None = None) -> dict:
    """The automatic plan for ``target`` with its chips' HBM (or ``memory_per_device``) as the limit:
    MemoryLimitError, before anything is compiled."""
    from onnx2jax.runtime import targets
    from onnx2jax.runtime.tpu_report import device_chip
    from sharding.auto import auto_plan
    from sharding.auto.errors import MemoryLimitError

    path = make(name, folder)
    devices = targets.parse_target(target).devices()
    try:
        auto_plan(onnx.load(str(path), load_external_data=False), len(devices), batch=batch, seq=seq,
                  memory_per_device=memory_per_device or device_chip(devices).hbm_bytes)
    except MemoryLimitError as error:
        return {"run": "refuse", "target": target, "refused": type(error).__name__, "message": str(error)[:600]}
    return {"run": "refuse", "target": target, "refused": None}


def measure(args: argparse.Namespace) -> dict:
    """One configuration in this process, with its peak RSS."""
    folder = pathlib.Path(args.folder)
    batch, seq = args.shape
    if args.run in ("tiny", "8b"):
        result = run_prefill(args.run, folder, args.target or "tpu:v5e:2x4", 8, batch, seq)
    elif args.run == "70b":
        result = run_auto("70b", folder, args.target or "tpu:v5p:4x4x4", batch, seq, args.mesh)
    elif args.run == "multislice":
        result = run_multislice(args.model, folder, args.target or "tpu:v5e:2x4", batch, seq)
    elif args.run == "refuse":
        result = run_refuse(args.model, folder, args.target or "tpu:v5e:2x4", batch, seq)
    else:
        raise SystemExit(f"unknown run {args.run!r}")
    result["peak_rss_bytes"] = _peak_rss()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", required=True, choices=["tiny", "8b", "70b", "multislice", "refuse"])
    parser.add_argument("--folder", default="/tmp/tpu_models")
    parser.add_argument("--target", default=None)
    parser.add_argument("--model", default="tiny", choices=sorted(SHAPES), help="multislice/refuse: which shape")
    parser.add_argument("--shape", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1, 2048),
                        help="batch,seq of the input")
    parser.add_argument("--mesh", type=lambda s: tuple(int(x) for x in s.split(",")), default=None,
                        help="70b: data,tensor for the automatic plan to search within (default: every one)")
    parser.add_argument("--fresh", action="store_true", help="run in a fresh process (peak RSS its own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    if args.fresh:
        argv = [a for a in sys.argv[1:] if a != "--fresh"]
        out = subprocess.run([sys.executable, __file__, *argv, "--json"], stdout=subprocess.PIPE, text=True, check=True)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        result = measure(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
