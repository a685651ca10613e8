"""The LM head at the positions a generation step reads (onnx2jax.runtime.logit_positions, issue 28): the head
found structurally in torch exports and builder graphs (through a tied head's Transpose, gemma2's soft-capping,
int4's MatMulNBits), left alone where another reader would see the gathered positions; the handle's logits at
positions fed per row equal onnxruntime's logits at those positions of the unmodified model."""

import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.runtime.logit_positions import LOGIT_POSITIONS, gather_logit_positions, lm_head

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
TORCH = GENAI / "llama_gqa_torch"


@pytest.mark.parametrize("folder, head", [
    ("gpt2_torch_12heads", "node_linear"),  # a tied head: MatMul(hidden, Transpose(wte))
    ("llama_gqa_torch", "node_linear_14"),
    ("arch/gemma2_fp32", "/lm_head/MatMul"),  # logits = Mul(Tanh(Div(head, 3)), 3): soft-capping after the head
    ("llama_gqa_int4", "/lm_head/MatMul_Q4"),  # com.microsoft.MatMulNBits
])
def test_the_lm_head_is_found_in_exports_and_builder_graphs(folder, head):
    model = onnx.load(GENAI / folder / "model.onnx", load_external_data=False)
    assert lm_head(model.graph, "logits").name == head


def test_a_head_whose_output_another_reader_sees_is_left_as_it_is():
    model = onnx.load(TORCH / "model.onnx", load_external_data=False)
    head = lm_head(model.graph, "logits")
    model.graph.node.append(onnx.helper.make_node("Identity", [head.output[0]], ["also"]))
    model.graph.output.append(onnx.helper.make_tensor_value_info("also", onnx.TensorProto.FLOAT, None))
    before = model.SerializeToString()
    assert gather_logit_positions(model, "logits") is None
    assert model.SerializeToString() == before


def _ort_feeds(ids: np.ndarray) -> dict:
    batch, width = ids.shape
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.tile(np.arange(width), (batch, 1))}
    for i in ort.InferenceSession(str(TORCH / "model.onnx"), providers=["CPUExecutionProvider"]).get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((batch, 2, 0, 16), np.float32)
    return feeds


def test_the_handle_computes_logits_only_at_the_positions_fed_per_row():
    model = onnx2jax.load(TORCH)
    assert LOGIT_POSITIONS in model.model.input_names
    ids = np.array([[1, 42, 7, 99, 5], [3, 8, 250, 11, 60]], np.int64)
    feeds = _ort_feeds(ids)
    session = ort.InferenceSession(str(TORCH / "model.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(["logits"], feeds)[0]
    at = np.array([[[4]], [[1]]], np.int64)  # row 0's last position, row 1's second
    logits = np.asarray(model(**feeds, **{LOGIT_POSITIONS: at})[model.model.output_names.index("logits")])
    assert logits.shape == (2, 1, want.shape[-1])
    np.testing.assert_allclose(logits[:, 0], want[[0, 1], [4, 1]], rtol=1e-4, atol=1e-4)


def test_a_callers_model_on_one_device_is_neither_copied_nor_rewritten(monkeypatch):
    proto = onnx.load(TORCH / "model.onnx")
    copies = []
    deepcopy = onnx.ModelProto.__deepcopy__
    monkeypatch.setattr(onnx.ModelProto, "__deepcopy__", lambda p, memo: copies.append(1) or deepcopy(p, memo),
                        raising=False)
    model = onnx2jax.load(proto)
    assert not copies and LOGIT_POSITIONS not in model.model.input_names
    translated = onnx2jax.JaxModel(proto, scan_layers=False)
    assert onnx2jax.load(translated).model is translated  # the caller's translation, not made again
