"""Decoder LLMs with a KV cache (issue 20) sharded by the Megatron plan: one forward call each.

Every fixture of tests/data/genai (four onnxruntime-genai builder folders and a torch export) runs
`onnx2jax.compile(megatron_plan(model, N))` on 2, 4 and 8 of the 8 fake CPU devices, for a prefill with
an empty past (`forward_batch.npz`, a right- or left-padded batch of 2) and a decode call with a given past
of 6 positions (`forward.npz`). Checked against independent references:

* values: onnxruntime's stored outputs (every output of the decode call; the prefill's logits and cache at
  the real, unpadded positions, where onnxruntime's are specified) and the unsharded run of the same call;
* collectives in the compiled HLO: the analytic minimum per call, ``2 * layers + 1`` all-reduces and no
  other collective: per layer one after o_proj (attention row) and one after down_proj (MLP row), plus
  the vocabulary-parallel embedding's; the LM head is column-parallel over the vocabulary and its logits
  are returned vocab-sharded (gathering them, e.g. for argmax, is the caller's choice), so it adds none;
* the cache: every device holds ``1 / gcd(kv_heads, N)`` of each present key/value: ``1/N`` where the kv
  heads are at least N, and where N exceeds them each kv head replicated on the ``N / kv_heads`` devices
  whose query heads read it (MQA: whole on every device).

The torch export is planned with ``gqa="groups"`` (the default "replicate" keeps its k/v projections, and
so its cache, whole where N exceeds the kv heads); the builder graphs' GroupQueryAttention caches are split
in groups either way (sharding.megatron.specs.attention_specs).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
import onnx
import pytest

import onnx2jax
from sharding import megatron_layout, megatron_plan
from sharding import infer

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
# fixture -> (layers, kv heads)
FIXTURES = {
    "llama_gqa": (2, 2),
    "llama_mqa": (2, 1),
    "qwen2_window": (2, 2),
    "llama_gqa_int4": (2, 2),
    "llama_gqa_torch": (2, 2),
}
DEVICES = (2, 4, 8)


def _model(name: str) -> onnx.ModelProto:
    return onnx.load(GENAI / name / "model.onnx")


def _calls(name: str) -> dict[str, tuple[dict, dict, np.ndarray | None]]:
    """``call -> (inputs, onnxruntime's outputs, mask of real positions or None)``."""
    decode = np.load(GENAI / name / "forward.npz")
    batch = np.load(GENAI / name / "forward_batch.npz")
    prefill_in = {k.split(":", 1)[1]: batch[k] for k in batch.files if k.startswith("prefill:") and ":out:" not in k}
    prefill_out = {k.split(":out:", 1)[1]: batch[k] for k in batch.files if k.startswith("prefill:out:")}
    return {
        "prefill": (prefill_in, prefill_out, prefill_in["attention_mask"].astype(bool)),
        "decode": (
            {k: decode[k] for k in decode.files if not k.startswith("out:")},
            {k[4:]: decode[k] for k in decode.files if k.startswith("out:")},
            None,
        ),
    }


def _real(name: str, value: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """The positions onnxruntime specifies: every one, or a padded prefill's real tokens."""
    if mask is None:
        return value
    if name == "logits":  # [B, S, vocab]
        return value[mask]
    return np.concatenate([value[b][:, mask[b]].reshape(-1) for b in range(mask.shape[0])])  # [B, KV, T, D]


@pytest.fixture(scope="module")
def fixture(request):
    name = request.param
    model = _model(name)
    unsharded = onnx2jax.compile(model)
    calls = _calls(name)
    whole = {call: dict(zip([o.name for o in model.graph.output], unsharded(**inputs))) for call, (inputs, _, _) in calls.items()}
    return name, model, calls, whole


# 4 devices repeats what 2 and 8 show (a split of the heads, and more devices than kv heads): slow. At 2, the
# default run keeps the two exports whose 2 kv heads split one a device (builder's and torch's); the others at 2
# (one kv head replicated, the window, int4) repeat what 8 shows of them: slow.
TWO_DEVICES_DEFAULT = ("llama_gqa", "llama_gqa_torch")


@pytest.mark.parametrize(("fixture", "n"), [
    pytest.param(name, n, id=f"{name}-{n}",
                 marks=[pytest.mark.slow] if n == 4 or (n == 2 and name not in TWO_DEVICES_DEFAULT) else [])
    for name in FIXTURES for n in DEVICES
], indirect=["fixture"])
def test_sharded_forward_matches_onnxruntime_and_unsharded(fixture, n):
    name, model, calls, whole = fixture
    layers, kv_heads = FIXTURES[name]
    gqa = "groups" if name.endswith("_torch") else "replicate"
    compiled = onnx2jax.compile(megatron_plan(model, n, gqa=gqa))
    names = [o.name for o in model.graph.output]
    for call, (inputs, expected, mask) in calls.items():
        got = dict(zip(names, compiled(**inputs)))
        for out in names:
            value = np.asarray(got[out])
            np.testing.assert_allclose(value, np.asarray(whole[call][out]), rtol=1e-5, atol=1e-4, err_msg=f"{call} {out}")
            np.testing.assert_allclose(
                _real(out, value, mask), _real(out, expected[out], mask), rtol=1e-4, atol=1e-4, err_msg=f"{call} {out}"
            )
        # The analytic minimum: one all-reduce per row-parallel linear (o_proj, down_proj), one for the
        # vocabulary-parallel embedding; the vocab-sharded logits leave the program as they are.
        collectives = {k: v for k, v in compiled.report(**inputs).collectives.items() if v}
        assert collectives == {"all-reduce": 2 * layers + 1}, (call, collectives)
        # The cache: 1 / gcd(kv heads, N) of each present tensor on every device.
        for out in names:
            if not out.startswith("present"):
                continue
            array = got[out]
            total = array.size * array.dtype.itemsize
            per_device = {s.data.size * s.data.dtype.itemsize for s in array.addressable_shards}
            assert per_device == {total // math.gcd(kv_heads, n)}, (call, out, per_device, total)


@pytest.mark.parametrize("name", ["llama_gqa", "llama_mqa", "qwen2_window"])
def test_decode_into_a_fixed_capacity_cache_sharded(name):
    """A generation loop's layout (onnxruntime-genai's shared past/present buffer): the decode call's past
    padded to a capacity of 16 positions, updated in place. On 8 devices the logits and the cache's first 9
    positions equal onnxruntime's growing-cache call, with the same 2 * layers + 1 all-reduces."""
    model = _model(name)
    decode = np.load(GENAI / name / "forward.npz")
    inputs = {k: decode[k] for k in decode.files if not k.startswith("out:")}
    for key in [k for k in inputs if k.startswith("past_key_values")]:
        inputs[key] = np.pad(inputs[key], ((0, 0), (0, 0), (0, 16 - inputs[key].shape[2]), (0, 0)))
    compiled = onnx2jax.compile(megatron_plan(model, 8))
    names = [o.name for o in model.graph.output]
    got = dict(zip(names, compiled(**inputs)))
    for out in names:
        value = np.asarray(got[out])
        if out.startswith("present"):
            assert value.shape[2] == 16
            value = value[:, :, : decode[f"out:{out}"].shape[2]]
        np.testing.assert_allclose(value, decode[f"out:{out}"], rtol=1e-4, atol=1e-4, err_msg=out)
    collectives = {k: v for k, v in compiled.report(**inputs).collectives.items() if v}
    assert collectives == {"all-reduce": 2 * FIXTURES[name][0] + 1}


@pytest.mark.parametrize("name", [n for n in FIXTURES if not n.endswith("_torch")])
def test_plan_checks_and_reshards_only_locally(name):
    """The plan passes the op rules (no error), every node's rule gives back its written outputs except the
    attention output, which the plan cuts finer than the cache's kv groups: a local slice, no collective."""
    model = onnx.load(GENAI / name / "model.onnx", load_external_data=False)
    for n in DEVICES:
        result = infer(megatron_plan(model, n))
        assert [d for d in result.diagnostics if d.severity == "error"] == []
        reshards = [d for d in result.diagnostics if d.code == "reshard"]
        assert all(d.message.endswith("(dynamic-slice)") and "GroupQueryAttention" in d.node for d in reshards)
        assert sum(d.code == "collective" for d in result.diagnostics) == 2 * FIXTURES[name][0] + 1


@pytest.mark.parametrize("name", list(FIXTURES))
def test_plan_writes_the_past_cache_by_kv_heads(name):
    """The plan places each past key/value input where its present lives (axis 1 in gcd(kv, N) shards, on
    the groups of devices whose query heads read it), so a loop feeding the presents back moves nothing."""
    model = onnx.load(GENAI / name / "model.onnx", load_external_data=False)
    past = [i.name for i in model.graph.input if i.name.startswith("past_key_values")]
    kv = FIXTURES[name][1]
    gqa = "groups" if name.endswith("_torch") else "replicate"
    for n in DEVICES:
        written = {a.spec.tensor_name: a.spec for a in megatron_layout(model, n, gqa=gqa).assignments}
        ways = math.gcd(kv, n)
        for tensor in past:
            if ways == 1:
                spec = written.get(tensor)
                assert spec is None or spec.num_shards == 1
                continue
            spec = written[tensor]
            assert [(d.axis % 4, d.num_shards) for d in spec.sharded_dims] == [(1, ways)]
            assert [sorted(spec.devices_of_shard(i)) for i in range(ways)] == [
                list(range(i * n // ways, (i + 1) * n // ways)) for i in range(ways)
            ]


def test_plan_says_what_it_leaves_whole():
    """No silent replication: the packed q|k|v under GQA stays whole with a note saying why, the cache's
    groups are noted, and int4's o_proj (4 blocks of 32 along K) is split 4 ways on 8 devices, noted."""
    notes = megatron_layout(_model("llama_gqa"), 8).notes
    assert sum("packs q|k|v of 8|2|2 heads" in note and "stays whole" in note for note in notes) == 2
    assert sum("2 kv heads for 8 shards" in note for note in notes) == 2
    int4 = megatron_layout(_model("llama_gqa_int4"), 8)
    assert sum("quantized in 4 blocks along K" in note for note in int4.notes) == 2
    assert [p.ways for p in int4.pairs] == [4, 8, 4, 8]


def test_int4_specs_split_packed_weights_by_n_and_by_k_blocks():
    """MatMulNBits: a column cuts B [N, blocks, blob] and scales [N, blocks] on N (axis 0), a row on the
    blocks axis 1; the LM head cuts the vocabulary (N)."""
    layout = megatron_layout(_model("llama_gqa_int4"), 2)
    specs = {(a.node, a.spec.tensor_name): a.spec for a in layout.assignments}

    def cut(node, tensor):
        spec = specs[(node, tensor)]
        return [(d.axis, d.num_shards) for d in spec.sharded_dims if d.num_shards > 1]

    gate = "/model/layers.0/mlp/gate_proj/MatMul_Q4"
    down = "/model/layers.0/mlp/down_proj/MatMul_Q4"
    assert cut(gate, "model.layers.0.mlp.gate_proj.MatMul.weight_Q4") == [(0, 2)]
    assert cut(gate, "model.layers.0.mlp.gate_proj.MatMul.weight_scales") == [(0, 2)]
    assert cut(down, "model.layers.0.mlp.down_proj.MatMul.weight_Q4") == [(1, 2)]
    assert cut(down, "model.layers.0.mlp.down_proj.MatMul.weight_scales") == [(1, 2)]
    assert cut("/lm_head/MatMul_Q4", "lm_head.MatMul.weight_Q4") == [(0, 2)]
    assert layout.lm_head == "/lm_head/MatMul_Q4"


def test_xla_slices_of_a_replicated_tensor_still_permute():
    """The upstream behaviour behind GroupQueryAttention's gathers (docs/known-issues.md): slicing parts
    out of a replicated tensor and splitting them costs collective-permutes; the gathers cost none."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    split = NamedSharding(mesh, PartitionSpec(None, "x"))

    def permutes(cut) -> int:
        def f(x):
            q, k = cut(jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec())))
            return jax.lax.with_sharding_constraint(q, split) * 2, jax.lax.with_sharding_constraint(k, split) * 2

        return jax.jit(f).lower(jnp.ones((3, 192))).compile().as_text().count("collective-permute")

    assert permutes(lambda x: (jnp.take(x, np.arange(128), axis=1), jnp.take(x, np.arange(128, 160), axis=1))) == 0
    assert permutes(lambda x: (x[:, :128], x[:, 128:160])) > 0, (
        "upstream fixed it: GroupQueryAttention may slice its packed query again (onnx2jax/ops/"
        "contrib_attention.py) and the entry in docs/known-issues.md can go"
    )
