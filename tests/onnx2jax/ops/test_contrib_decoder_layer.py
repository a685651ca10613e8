"""A decoder layer built the way onnxruntime-genai's model builder writes one, run token by token through
onnxruntime and onnx2jax: the contrib ops composed, seqlens_k and total_sequence_length computed from the
attention mask (so total_sequence_length is known while tracing, as it is in a builder's model), and the present
cache fed back as the next step's past."""

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import onnxruntime as ort
import pytest

from onnx2jax.translate import translate

RNG = np.random.default_rng(0)
VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD, FFN, BLOCK = 50, 64, 4, 2, 16, 96, 32
MS = "com.microsoft"


def _int4_linear(name, x, k, n, nodes, inits):
    """MatMulNBits(x) with random packed weights, uint8 zero points and scales."""
    blocks = k // BLOCK
    inits += [
        onh.from_array(RNG.integers(0, 256, (n, blocks, BLOCK // 2)).astype(np.uint8), f"{name}.B"),
        onh.from_array((RNG.random(n * blocks) * 0.05 + 0.01).astype(np.float32), f"{name}.scales"),
        onh.from_array(RNG.integers(0, 256, n * -(-blocks // 2)).astype(np.uint8), f"{name}.zp"),
    ]
    nodes.append(oh.make_node(
        "MatMulNBits", [x, f"{name}.B", f"{name}.scales", f"{name}.zp"], [name], domain=MS,
        K=k, N=n, bits=4, block_size=BLOCK, accuracy_level=4,
    ))
    return name


def _float(name, *shape, scale=1.0):
    return onh.from_array((RNG.standard_normal(shape) * scale).astype(np.float32), name)


def decoder_layer(local_window_size=-1, softcap=0.0):
    nodes, inits = [], []
    inits += [_float("embed", VOCAB, HIDDEN), _float("ln1", HIDDEN), _float("ln2", HIDDEN), _float("lnf", HIDDEN)]
    inits += [_float("gate", HIDDEN, FFN, scale=0.2), _float("up", HIDDEN, FFN, scale=0.2)]
    inits += [_float("lm_head", HIDDEN, VOCAB, scale=0.2), _float("cos", 64, HEAD // 2), _float("sin", 64, HEAD // 2)]
    inits += [onh.from_array(np.array([1], np.int64), "one_axis"), onh.from_array(np.array(1, np.int64), "one")]
    nodes += [
        oh.make_node("Gather", ["embed", "input_ids"], ["emb"]),
        oh.make_node("SimplifiedLayerNormalization", ["emb", "ln1"], ["n1"], epsilon=1e-6),
        # The builder's attention mask reformatting for GroupQueryAttention.
        oh.make_node("ReduceSum", ["attention_mask", "one_axis"], ["lengths"], keepdims=0),
        oh.make_node("Sub", ["lengths", "one"], ["last"]),
        oh.make_node("Cast", ["last"], ["seqlens_k"], to=onnx.TensorProto.INT32),
        oh.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        oh.make_node("Gather", ["mask_shape", "one"], ["total64"], axis=0),
        oh.make_node("Cast", ["total64"], ["total"], to=onnx.TensorProto.INT32),
    ]
    q = _int4_linear("q", "n1", HIDDEN, HEADS * HEAD, nodes, inits)
    k = _int4_linear("k", "n1", HIDDEN, KV_HEADS * HEAD, nodes, inits)
    v = _int4_linear("v", "n1", HIDDEN, KV_HEADS * HEAD, nodes, inits)
    nodes.append(oh.make_node(
        "GroupQueryAttention", [q, k, v, "past_key_values.0.key", "past_key_values.0.value", "seqlens_k", "total",
                                "cos", "sin"],
        ["attn", "present.0.key", "present.0.value"], domain=MS, num_heads=HEADS, kv_num_heads=KV_HEADS,
        do_rotary=1, local_window_size=local_window_size, softcap=softcap,
    ))
    o = _int4_linear("o", "attn", HEADS * HEAD, HIDDEN, nodes, inits)
    nodes += [
        oh.make_node("SkipSimplifiedLayerNormalization", [o, "emb", "ln2"], ["n2", "", "", "res"], domain=MS,
                     epsilon=1e-6),
        oh.make_node("MatMul", ["n2", "gate"], ["g"]),
        oh.make_node("MatMul", ["n2", "up"], ["u"]),
        oh.make_node("FastGelu", ["g"], ["act"], domain=MS),
        oh.make_node("Mul", ["act", "u"], ["h"]),
    ]
    down = _int4_linear("down", "h", FFN, HIDDEN, nodes, inits)
    nodes += [
        oh.make_node("SkipSimplifiedLayerNormalization", [down, "res", "lnf"], ["nf"], domain=MS, epsilon=1e-6),
        oh.make_node("MatMul", ["nf", "lm_head"], ["logits"]),
    ]
    cache = ["batch", KV_HEADS, "past_length", HEAD]
    graph = oh.make_graph(
        nodes, "decoder",
        [
            oh.make_tensor_value_info("input_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
            oh.make_tensor_value_info("attention_mask", onnx.TensorProto.INT64, ["batch", "total"]),
            oh.make_tensor_value_info("past_key_values.0.key", onnx.TensorProto.FLOAT, cache),
            oh.make_tensor_value_info("past_key_values.0.value", onnx.TensorProto.FLOAT, cache),
        ],
        [
            oh.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["batch", "seq", VOCAB]),
            oh.make_tensor_value_info("present.0.key", onnx.TensorProto.FLOAT, ["batch", KV_HEADS, "total", HEAD]),
            oh.make_tensor_value_info("present.0.value", onnx.TensorProto.FLOAT, ["batch", KV_HEADS, "total", HEAD]),
        ],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 21), oh.make_opsetid(MS, 1)], ir_version=10)


# a cache grown each step, or one buffer of fixed capacity; plain attention, or a window with soft-capping. The
# default run takes the plain layer on a growing cache and the windowed one in a fixed buffer; the crossings: slow
@pytest.mark.parametrize(("attrs", "capacity"), [
    pytest.param({}, 0, id="attrs0-0"),
    pytest.param({}, 12, id="attrs0-12", marks=pytest.mark.slow),
    pytest.param({"local_window_size": 3, "softcap": 5.0}, 0, id="attrs1-0", marks=pytest.mark.slow),
    pytest.param({"local_window_size": 3, "softcap": 5.0}, 12, id="attrs1-12"),
])
def test_prompt_then_decode_steps(attrs, capacity):
    model = decoder_layer(**attrs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    jax_model = translate(model)
    batch, prompt = 2, 5
    lengths = np.array([5, 3])  # the second row right-padded, as GroupQueryAttention reads seqlens_k
    ids = RNG.integers(0, VOCAB, (batch, prompt)).astype(np.int64)
    mask = (np.arange(prompt)[None] < lengths[:, None]).astype(np.int64)
    past = np.zeros((batch, KV_HEADS, capacity, HEAD), np.float32)
    feeds = {"input_ids": ids, "attention_mask": mask, "past_key_values.0.key": past, "past_key_values.0.value": past}
    for step in range(4):
        expected = session.run(None, feeds)
        actual = [np.asarray(a) for a in jax_model(**feeds)]
        valid = feeds["attention_mask"].sum(axis=1)
        for row in range(batch):
            tokens = slice(0, prompt if step == 0 else 1)
            if step == 0:
                tokens = slice(0, valid[row])
            np.testing.assert_allclose(actual[0][row, tokens], expected[0][row, tokens], rtol=1e-4, atol=1e-4)
            for cache in (1, 2):
                np.testing.assert_allclose(
                    actual[cache][row, :, : valid[row]], expected[cache][row, :, : valid[row]], rtol=1e-5, atol=1e-5
                )
        # Next step: each row's next token after its last real one; the cache is onnxruntime's own.
        last = np.array([expected[0][r, (valid[r] - 1) if step == 0 else 0].argmax() for r in range(batch)])
        if step == 0:  # the padded row continues at its own length: both rows grow one slot per step
            mask = np.ones((batch, prompt), np.int64)
            mask[1, lengths[1]:] = 0
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
        feeds = {
            "input_ids": last[:, None].astype(np.int64), "attention_mask": mask,
            "past_key_values.0.key": expected[1], "past_key_values.0.value": expected[2],
        }
