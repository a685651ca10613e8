"""Make the small torch-exported transformer fixtures in tests/data/.

Needs torch and friends, which the library itself does not (use a separate venv):

    pip install torch==2.13.0 transformers onnxscript onnx onnxruntime numpy
    python scripts/make_fixtures.py

Writes, for each fixture NAME in (tiny_llama, tiny_gpt2, tiny_bert):

    tests/data/NAME.onnx              the model, torch.onnx.export(dynamo=True), weights inline
    tests/data/NAME.inputs.npz        inputs, batch 2 x seq 16
    tests/data/NAME.ort_outputs.npz   onnxruntime's outputs for those inputs

and tests/data/README.md describing them (op histograms, opsets, inputs/outputs).

The models are transformers classes built from a tiny config object with random
weights (torch.manual_seed(0)); nothing is downloaded. Every parameter is
perturbed away from its constant initial value (LayerNorm/RMSNorm weights of
ones, biases of zeros) so that each parameter is its own distinct initializer:
torch's ONNX optimizer deduplicates equal constants, which would otherwise make
e.g. every RMSNorm share one weight tensor.

The export is the default torch pipeline (decompositions, translation, the
onnxscript optimizer), followed by one post-processing step: the per-node
`pkg.torch.onnx.stack_trace` metadata is dropped, since it holds this machine's
file paths and would make the files differ from machine to machine. The other
metadata torch writes (namespace, name_scopes, class_hierarchy, fx_node) is kept:
`namespace` names the torch module a node came from (e.g.
`model.layers.0.self_attn.q_proj: torch.nn.modules.linear.Linear`).

Checks done here: onnx.checker (full), unique non-empty node names, no
FunctionProtos / non-default domains (reported if present), onnxruntime vs
torch within 1e-4 on the saved inputs and on a second shape (dynamic axes).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import io
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
TOL = 1e-4
BATCH, SEQ = 2, 16
MAX_SEQ = 64  # n_positions / max_position_embeddings of every fixture

DTYPE_NAMES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.BOOL: "bool",
}


# --------------------------------------------------------------------------- models


def _distinct_params(model: torch.nn.Module, seed: int) -> None:
    """Move every constant-initialised parameter (ones, zeros) off its constant.

    A trained model has no two equal weight tensors; random init leaves every
    norm weight at 1 and every bias at 0, and the exporter would fold those
    into one shared initializer each.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            flat = p.detach().reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                p.add_(0.05 * torch.randn(p.shape, generator=g))


# Hand-written summaries of the graphs (B = batch, S = seq), checked against the
# exports of torch 2.13.0 / transformers 5.23.0; the README's node listings are
# generated and are the exact truth.
LLAMA_NOTES = """
Graph structure (B = batch, S = seq):

- Embedding: `Gather(model.model.embed_tokens.weight [256,64], input_ids)`.
- Causal mask, built once in the `LlamaModel` scope and shared by both layers:
  position ids `Range(0, S)` expanded to [B,S]; transformers' packed-sequence
  detection (`Sub`/`Equal`/`Not`/`Cast`/`CumSum` over position-id differences) and
  its vmapped mask function (`Max`/`Expand`/`Concat` index building, 4 `GatherND`,
  `Equal`, `LessOrEqual` for kv_pos <= q_pos, `And`) end in
  `Where(cond, 0.0, -3.4028235e38)`: a float additive mask [B,1,S,S].
- RoPE tables, once: `Cast(position ids [1,S,1]) * model.model.rotary_emb.inv_freq [4]`
  (the `inv_freq @ positions` matmul is optimized to a broadcast `Mul`) ->
  `Concat(f, f)` -> `Cos`, `Sin` [1,S,8] -> `Unsqueeze(axis 1)` [1,1,S,8].
- RMSNorm: `Pow(x, 2)` -> `ReduceMean(axes=[-1], keepdims=1)` -> `Add(eps)` -> `Sqrt` ->
  `Reciprocal` -> `Mul(x, .)` -> `Mul(weight [64], .)`.
- nn.Linear (no bias): `MatMul(x, W^T)`; W^T is a folded initializer `val_N` of shape [in,out].
- Attention: q/k/v `MatMul` ([64,64], [64,32], [64,32]) -> `Reshape [B,S,-1,8]` ->
  `Transpose perm=[0,2,1,3]`: q [B,8,S,8], k/v [B,4,S,8]. RoPE on q and k:
  `x*cos + Concat(Neg(Slice(x, 4:)), Slice(x, 0:4)) * sin` (rotate_half on the last axis).
  GQA repeat_kv on k and v: `Unsqueeze(axis 2)` [B,4,1,S,8] ->
  `Expand [B,4,2,S,8]` -> `Reshape [B,8,S,8]` (the 4, 2 and 8 are constants).
  Then `MatMul(q, Transpose(k, [0,1,3,2]))` -> `Mul(1/sqrt(8))` -> `Add(mask)` ->
  `Softmax(axis=-1)` -> `MatMul(., v)` -> `Transpose [0,2,1,3]` -> `Reshape [B,S,-1]` ->
  o_proj `MatMul [64,64]` -> residual `Add`.
- MLP: gate `MatMul [64,128]` -> `Sigmoid` + `Mul` (SiLU); up `MatMul [64,128]`;
  `Mul`; down `MatMul [128,64]`; residual `Add`.
- Final RMSNorm, lm_head `MatMul [64,256]` (untied) -> `logits`.
- Note for shape-constant rewriting: head_dim == num_heads == 8 and
  head_dim/2 == num_kv_heads == 4, and the optimizer deduplicates equal constants,
  so one `[8]` initializer feeds both the head-split Reshape (as head_dim) and the GQA
  Reshape (as num_heads), and one `[4]` both the RoPE Slices and the GQA Expand.
"""

GPT2_NOTES = """
Graph structure (B = batch, S = seq):

- Embedding: `Reshape(input_ids, [-1,S])`; `Gather(model.lm_head.weight [256,64], ids)`
  (wte and lm_head are tied: one initializer, named after lm_head) +
  `Gather(model.transformer.wpe.weight [64,64], Unsqueeze(Range(0,S)))` -> `Add`.
- Causal mask: same construction as tiny_llama (CumSum/GatherND/.../`Where`) -> [B,1,S,S].
- Conv1D (weight stored [in,out]): `Reshape(x, [-1,in])` -> `Gemm(x, W, b)` with
  transA=0, transB=0 -> `Reshape [B,S,out]`. Weights keep their parameter names.
- Attention: `LayerNormalization`(ln_1) -> `Gemm(c_attn.weight [64,192], c_attn.bias [192])`
  -> `Reshape [B,S,192]` -> `Split(axis=2, num_outputs=3)` (no split input: equal
  thirds q|k|v, columns 0:64, 64:128, 128:192 of W) -> each `Reshape [B,S,-1,8]`;
  q, v `Transpose [0,2,1,3]`, k `Transpose [0,2,3,1]` (two transposes fused) ->
  `MatMul(q, kT)` -> `Mul(1/sqrt(8))` -> `Add(mask)` -> `Softmax` -> `MatMul(., v)` ->
  `Transpose [0,2,1,3]` -> `Reshape [-1,64]` -> `Gemm(c_proj [64,64], bias)` ->
  `Reshape [B,S,64]` -> residual `Add`.
- MLP: `LayerNormalization`(ln_2) -> `Gemm(c_fc [64,256])` -> gelu_new written out
  (`0.5*x * (1 + Tanh(0.7978846*(x + 0.044715*Pow(x,3))))`) -> `Gemm(c_proj [256,64])`
  -> residual `Add`.
- Final `LayerNormalization`(ln_f) -> `MatMul(., Transpose(model.lm_head.weight, [1,0]))`
  -> `logits` (the transpose is not folded because the weight is shared with the Gather).
"""

BERT_NOTES = """
Graph structure (B = batch, S = seq):

- Embeddings: `Gather(word_embeddings [256,64], input_ids)` +
  `Gather(token_type_embeddings [2,64], token type ids)` (the all-zero `token_type_ids`
  buffer is an int64 initializer named `expand` [1,64], read by `GatherElements` and
  `Expand`ed to [B,S]) + `Gather(position_embeddings [64,64], Slice(position_ids buffer))`
  -> `LayerNormalization` (eps 1e-12).
- Padding mask: `Cast(attention_mask -> bool)`, indexed by `GatherND` over the key axis,
  `And` with `GreaterOrEqual` -> `Where(cond, 0.0, -3.4028235e38)`: additive [B,1,S,S].
- nn.Linear with bias on 3-D input: `MatMul(x, W^T)` (folded `val_N` [in,out]) then
  `Add(bias)`; on the 2-D pooler input: `Gemm(transB=1)` with the untransposed weight.
- Attention: q/k/v `MatMul`+`Add` -> `Reshape [B,S,-1,8]`; q, v `Transpose [0,2,1,3]`,
  k `Transpose [0,2,3,1]` -> `MatMul` -> `Mul(1/sqrt(8))` -> `Add(mask)` -> `Softmax` ->
  `MatMul` -> `Transpose [0,2,1,3]` -> `Reshape [B,S,-1]` -> output.dense `MatMul`+`Add`
  -> residual `Add` -> `LayerNormalization`.
- FFN: `MatMul [64,128]`+`Add` -> exact GELU `x * (0.5 * (Erf(x / 1.4142135) + 1))` ->
  `MatMul [128,64]`+`Add` -> residual `Add` -> `LayerNormalization`.
- Pooler: `Gather(last_hidden_state, 0, axis=1)` -> `Gemm(pooler.dense.weight [64,64],
  bias, transB=1)` -> `Tanh` -> `pooler_output`.
"""


def build_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=MAX_SEQ,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    _distinct_params(model, 1)

    def inputs(batch, seq, seed):
        g = torch.Generator().manual_seed(seed)
        return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)}

    return dict(
        name="tiny_llama",
        model=model,
        kwargs=dict(use_cache=False),
        out_attrs=["logits"],
        inputs=inputs,
        dynamic={"input_ids": {0: "batch", 1: "seq"}},
        layer0="model.model.layers.0",
        notes=LLAMA_NOTES,
        source="transformers.LlamaForCausalLM",
        config=cfg,
        config_keys=[
            "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
            "rms_norm_eps", "rope_parameters", "hidden_act", "attention_bias", "mlp_bias",
            "tie_word_embeddings", "use_cache",
        ],
    )


def build_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=256,
        n_positions=MAX_SEQ,
        n_embd=64,
        n_layer=2,
        n_head=8,
        n_inner=None,  # 4 * n_embd = 256
        activation_function="gelu_new",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=255,
        eos_token_id=255,
        tie_word_embeddings=True,  # as the real GPT-2: lm_head shares wte
        use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()
    _distinct_params(model, 2)

    def inputs(batch, seq, seed):
        g = torch.Generator().manual_seed(seed)
        return {"input_ids": torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)}

    return dict(
        name="tiny_gpt2",
        model=model,
        kwargs=dict(use_cache=False),
        out_attrs=["logits"],
        inputs=inputs,
        dynamic={"input_ids": {0: "batch", 1: "seq"}},
        layer0="model.transformer.h.0",
        notes=GPT2_NOTES,
        source="transformers.GPT2LMHeadModel",
        config=cfg,
        config_keys=[
            "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
            "activation_function", "layer_norm_epsilon", "tie_word_embeddings", "use_cache",
        ],
    )


def build_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=8,
        intermediate_size=128,
        max_position_embeddings=MAX_SEQ,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = BertModel(cfg, add_pooling_layer=True).eval()
    _distinct_params(model, 3)

    def inputs(batch, seq, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        if batch > 1:  # right-padding on the last sequence
            mask[-1, seq - seq // 4 :] = 0
        return {"input_ids": ids, "attention_mask": mask}

    return dict(
        name="tiny_bert",
        model=model,
        kwargs={},
        out_attrs=["last_hidden_state", "pooler_output"],
        inputs=inputs,
        dynamic={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}},
        layer0="model.encoder.layer.0",
        notes=BERT_NOTES,
        source="transformers.BertModel (add_pooling_layer=True)",
        config=cfg,
        config_keys=[
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "intermediate_size", "max_position_embeddings", "type_vocab_size", "hidden_act",
            "layer_norm_eps",
        ],
    )


BUILDERS = {"tiny_llama": build_llama, "tiny_gpt2": build_gpt2, "tiny_bert": build_bert}


class Wrapper(torch.nn.Module):
    """Returns the named output tensors of a transformers model as a plain tuple."""

    def __init__(self, model, kwargs, out_attrs):
        super().__init__()
        self.model = model
        self._kwargs = kwargs
        self._out_attrs = out_attrs

    def forward(self, input_ids, attention_mask=None):
        inputs = {"input_ids": input_ids}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask
        out = self.model(**inputs, **self._kwargs)
        return tuple(getattr(out, a) for a in self._out_attrs)


# --------------------------------------------------------------------------- export


def export(spec, opset: int) -> onnx.ModelProto:
    wrapper = Wrapper(spec["model"], spec["kwargs"], spec["out_attrs"]).eval()
    example = spec["inputs"](BATCH, SEQ, seed=0)
    dims = {}
    dynamic = {
        k: {ax: dims.setdefault(n, torch.export.Dim(n, max=MAX_SEQ if n == "seq" else 1024))
            for ax, n in v.items()}
        for k, v in spec["dynamic"].items()
    }
    log = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(log), torch.no_grad():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            wrapper,
            (),
            kwargs=example,
            dynamo=True,
            opset_version=opset,
            external_data=False,
            input_names=list(example),
            output_names=list(spec["out_attrs"]),
            dynamic_shapes=dynamic,
        )
    proto = prog.model_proto
    _strip_machine_metadata(proto)
    return proto


def _strip_machine_metadata(proto: onnx.ModelProto) -> None:
    def clean(props):
        keep = [p for p in props if p.key != "pkg.torch.onnx.stack_trace"]
        del props[:]
        props.extend(keep)

    def walk(graph):
        for n in graph.node:
            clean(n.metadata_props)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
                for sg in a.graphs:
                    walk(sg)

    walk(proto.graph)
    for f in proto.functions:
        for n in f.node:
            clean(n.metadata_props)
    # producer_version differs between torch builds only; keep it, it is informative.


def check_names(proto: onnx.ModelProto) -> None:
    names = [n.name for n in proto.graph.node]
    assert all(names), "a node has no name"
    dup = [k for k, c in collections.Counter(names).items() if c > 1]
    assert not dup, f"duplicate node names: {dup[:5]}"


# --------------------------------------------------------------------------- describe


def _dims(vi):
    return [d.dim_param if d.dim_param else d.dim_value for d in vi.type.tensor_type.shape.dim]


def describe(proto: onnx.ModelProto) -> dict:
    g = proto.graph
    hist = collections.Counter(
        (n.domain or "ai.onnx", n.op_type) for n in g.node
    )
    return dict(
        opsets=[(o.domain or "ai.onnx", o.version) for o in proto.opset_import],
        inputs=[(i.name, _dims(i), DTYPE_NAMES.get(i.type.tensor_type.elem_type, "?")) for i in g.input],
        outputs=[(o.name, _dims(o), DTYPE_NAMES.get(o.type.tensor_type.elem_type, "?")) for o in g.output],
        hist=sorted(hist.items(), key=lambda kv: (-kv[1], kv[0][1])),
        n_nodes=len(g.node),
        n_init=len(g.initializer),
        n_params=int(sum(np.prod(t.dims) for t in g.initializer)),
        functions=[(f.domain, f.name) for f in proto.functions],
        nondefault=sorted({n.domain for n in g.node if n.domain not in ("", "ai.onnx")}),
    )


def _meta(node, key):
    return next((p.value for p in node.metadata_props if p.key == key), "")


def _module(node):
    """The innermost torch module a node came from, per its `namespace` metadata."""
    ns = _meta(node, "namespace")
    return ns.split("/")[-2].split(":")[0] if ns.count("/") >= 1 else ""


def weight_table(proto: onnx.ModelProto) -> list[tuple]:
    """(node, op_type, weight, shape, torch module) for each MatMul/Gemm/Gather on a 2-D weight.

    A weight reached through a Transpose of an initializer is shown as `Transpose(name)`.
    """
    g = proto.graph
    inits = {t.name: list(t.dims) for t in g.initializer}
    transposed = {
        n.output[0]: n.input[0] for n in g.node if n.op_type == "Transpose" and n.input[0] in inits
    }
    rows = []
    for n in g.node:
        if n.op_type not in ("MatMul", "Gemm", "Gather"):
            continue
        for i in n.input:
            if i in inits and len(inits[i]) == 2:
                rows.append((n.name, n.op_type, f"`{i}`", inits[i], _module(n)))
            elif i in transposed and len(inits[transposed[i]]) == 2:
                src = transposed[i]
                rows.append((n.name, n.op_type, f"Transpose(`{src}`)", inits[src][::-1], _module(n)))
    return rows


def layer_listing(proto: onnx.ModelProto, scope: str) -> list[str]:
    """The nodes of one layer, in graph order, one line each.

    The layer is the contiguous run of nodes from the first to the last whose
    name_scopes include `scope` (nodes made by optimizer rewrites, e.g. Split,
    carry no metadata but sit inside that run). Initializer inputs show their
    shape, or their value when small.
    """
    from onnx import numpy_helper

    g = proto.graph
    inits = {t.name: t for t in g.initializer}
    idx = [k for k, n in enumerate(g.node) if f"'{scope}'" in _meta(n, "pkg.torch.onnx.name_scopes")]
    lines = []
    for n in g.node[idx[0] : idx[-1] + 1]:
        ins = []
        for i in n.input:
            if i in inits:
                a = numpy_helper.to_array(inits[i])
                ins.append(f"{i}={a.tolist()}" if a.size <= 4 and a.dtype != np.float32 or a.ndim == 0
                           else f"{i}[{','.join(map(str, a.shape))}]")
            else:
                ins.append(i)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        at = " " + " ".join(f"{k}={v}" for k, v in sorted(attrs.items())) if attrs else ""
        mod = _module(n).replace(scope + ".", "").replace(scope, "(block)")
        lines.append(f"{n.name} = {n.op_type}({', '.join(ins)}){at} -> {', '.join(n.output)}"
                     + (f"   # {mod}" if mod else ""))
    return lines


# --------------------------------------------------------------------------- run


def torch_outputs(spec, inputs):
    wrapper = Wrapper(spec["model"], spec["kwargs"], spec["out_attrs"]).eval()
    with torch.no_grad():
        outs = wrapper(**inputs)
    return {n: o.detach().numpy() for n, o in zip(spec["out_attrs"], outs)}


def ort_outputs(path, inputs):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    res = sess.run(names, {k: v.numpy() for k, v in inputs.items()})
    return dict(zip(names, res))


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), (a.keys(), b.keys())
    return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a)


def save_npz(path: str, arrays: dict) -> None:
    """np.savez, but byte-for-byte reproducible (fixed zip timestamps); np.load reads it."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--opset", type=int, default=18)
    ap.add_argument("--out", default=DATA)
    ap.add_argument("names", nargs="*", default=list(BUILDERS))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    summaries = []
    for name in args.names:
        spec = BUILDERS[name]()
        path = os.path.join(args.out, f"{name}.onnx")
        proto = export(spec, args.opset)
        check_names(proto)
        onnx.save(proto, path)
        onnx.checker.check_model(path, full_check=True)

        inputs = spec["inputs"](BATCH, SEQ, seed=0)
        want = torch_outputs(spec, inputs)
        got = ort_outputs(path, inputs)
        diff = max_diff(want, got)
        # a second shape: the batch/seq axes really are dynamic
        inputs2 = spec["inputs"](3, 7, seed=1)
        diff2 = max_diff(torch_outputs(spec, inputs2), ort_outputs(path, inputs2))
        print(f"{name}: max |torch - ort| = {diff:.3e} (2x16), {diff2:.3e} (3x7)")
        assert diff < TOL and diff2 < TOL, (name, diff, diff2)

        save_npz(os.path.join(args.out, f"{name}.inputs.npz"), {k: v.numpy() for k, v in inputs.items()})
        save_npz(os.path.join(args.out, f"{name}.ort_outputs.npz"), got)

        d = describe(proto)
        d.update(
            name=name,
            spec=spec,
            size=os.path.getsize(path),
            sha=hashlib.sha256(open(path, "rb").read()).hexdigest()[:16],
            diff=diff,
            diff2=diff2,
            weights=weight_table(proto),
            listing=layer_listing(proto, spec["layer0"]),
            opset=args.opset,
            out_shapes={k: (list(v.shape), str(v.dtype)) for k, v in got.items()},
            in_shapes={k: (list(v.shape), str(v.numpy().dtype)) for k, v in inputs.items()},
        )
        summaries.append(d)
        print_summary(d)

    if sorted(args.names) == sorted(BUILDERS) and os.path.abspath(args.out) == os.path.abspath(DATA):
        with open(os.path.join(args.out, "README.md"), "w") as f:
            f.write(readme(summaries))
        print(f"wrote {os.path.join(args.out, 'README.md')}")


def print_summary(d):
    print(f"  opset_import: {d['opsets']}   functions: {d['functions'] or 'none'}   "
          f"non-default domains: {d['nondefault'] or 'none'}")
    print(f"  size: {d['size']} bytes, {d['n_nodes']} nodes, {d['n_init']} initializers, "
          f"{d['n_params']} initializer elements")
    for n, s, t in d["inputs"]:
        print(f"  input  {n}: {t}{s}")
    for n, s, t in d["outputs"]:
        print(f"  output {n}: {t}{s}")
    print("  ops: " + ", ".join(f"{op}: {c}" for (_, op), c in d["hist"]))


def readme(summaries) -> str:
    L = []
    w = L.append
    w("# tests/data: torch-exported transformer fixtures\n")
    w("Generated by `scripts/make_fixtures.py`; do not edit by hand. To regenerate "
      "(in a venv separate from the library's, torch is not a dependency of onnx2jax):\n")
    w("```sh\npip install torch==2.13.0 transformers onnxscript onnx onnxruntime numpy\n"
      "python scripts/make_fixtures.py            # all three, opset 18, rewrites this README\n"
      "python scripts/make_fixtures.py --opset 20 tiny_llama --out /tmp/x   # variants\n```\n")
    w(f"Made with torch {torch.__version__}, transformers {_tf_version()}, onnx {onnx.__version__}, "
      f"onnxscript {_pkg_version('onnxscript')}, onnxruntime {ort.__version__}.\n")
    w("All models are transformers classes built from a tiny config with random weights "
      "(`torch.manual_seed(0)`, nothing downloaded); every constant-initialised parameter "
      "(norm weights of ones, zero biases) is perturbed so each parameter is a distinct "
      "initializer. Exported with `torch.onnx.export(..., dynamo=True, "
      "external_data=False)` and torch's default optimizer; the only post-processing is "
      "dropping the `pkg.torch.onnx.stack_trace` node metadata (machine paths). Nodes "
      "keep torch's `namespace` metadata, which names the source module of each node.\n")
    w("Each `NAME.inputs.npz` holds a batch-2, seq-16 input set (seeded) and "
      "`NAME.ort_outputs.npz` onnxruntime's outputs (CPU, 1 thread) for it, keyed by the "
      "graph's output names. The script asserts onnxruntime matches torch within 1e-4 on "
      "those inputs and on a batch-3, seq-7 set (the batch and seq axes are dynamic).\n")
    w("`tiny_llama.torch_grads.npz` (made by `scripts/make_grad_fixture.py`, not by this script) holds "
      "torch autograd's gradients of a fixed scalar loss of tiny_llama's logits (`loss_weights`) with "
      "respect to every initializer, in float64 rounded to float32: the reference of the training tests.\n")
    w("Opset: 18 (torch's default). With the same torch/transformers, `--opset 20` or 21 "
      "gives the same graphs except that tiny_bert's erf GELU becomes one `Gelu` node; "
      "`--opset 23` turns Llama's RMSNorm/RoPE/attention into fused `RMSNormalization`, "
      "`RotaryEmbedding` and `Attention` nodes (and onnxruntime 1.32 rejects that "
      "RotaryEmbedding for batch > 1: its cos/sin caches are [1,S,.]).\n")
    w("tiny_bert's `attention_mask` in the npz pads the last quarter of the second "
      "sequence (zeros), so the padding path of the mask is exercised.\n")
    w("`nn.Linear` weights appear as initializers named `val_N` holding W^T (shape [in, out]): "
      "torch's optimizer folds the `Transpose` of `nn.Linear.weight` into a new constant. "
      "The tables below map them back to modules via the node's `namespace` metadata. "
      "(GPT-2's Conv1D weights are stored [in, out] already and keep their names.)\n")
    for d in summaries:
        spec = d["spec"]
        w(f"\n## {d['name']}.onnx\n")
        w(f"- source: `{spec['source']}`, eager attention, eval mode")
        cfg = ", ".join(f"{k}={getattr(spec['config'], k, None)!r}" for k in spec["config_keys"])
        w(f"- config: {cfg}")
        w(f"- opset_import: " + ", ".join(f"`{dom}` {v}" for dom, v in d["opsets"]))
        w(f"- FunctionProtos: {len(d['functions'])}; non-default-domain nodes: "
          f"{', '.join(d['nondefault']) or 'none'}")
        w(f"- file size: {d['size']} bytes ({d['size'] / 1024:.0f} KiB); {d['n_nodes']} nodes, "
          f"{d['n_init']} initializers ({d['n_params']} elements)")
        w(f"- max |torch - onnxruntime|: {d['diff']:.2e} (2x16), {d['diff2']:.2e} (3x7)")
        w("- inputs:")
        for n, s, t in d["inputs"]:
            ex = d["in_shapes"][n]
            w(f"  - `{n}`: {t} {s} (npz: {ex[1]} {ex[0]})")
        w("- outputs:")
        for n, s, t in d["outputs"]:
            ex = d["out_shapes"][n]
            w(f"  - `{n}`: {t} {s} (npz: {ex[1]} {ex[0]})")
        w("\nOp types (`op_type`: count):\n")
        w("| op_type | count |\n| --- | --- |")
        for (dom, op), c in d["hist"]:
            w(f"| {op if dom == 'ai.onnx' else dom + '::' + op} | {c} |")
        w("\n2-D weight initializers consumed by MatMul/Gemm/Gather:\n")
        w("| node | op | initializer | shape | torch module |\n| --- | --- | --- | --- | --- |")
        for node, op, init, shape, module in d["weights"]:
            w(f"| {node} | {op} | {init} | {shape} | {module} |")
        w(f"\n{spec['notes'].strip()}\n")
        w(f"Layer 0 (`{spec['layer0']}`), every node in graph order "
          "(`# module` is the node's source module, from its namespace metadata):\n")
        w("```")
        L.extend(d["listing"])
        w("```")
    return "\n".join(L) + "\n"


def _tf_version():
    import transformers

    return transformers.__version__


def _pkg_version(name):
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    sys.exit(main())
