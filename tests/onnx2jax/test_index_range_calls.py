"""Issue 24, item 1: every way of calling a model refuses token ids beyond the vocabulary, as onnxruntime does.

XLA does not refuse an out-of-range Gather index (it clamps it, or fills NaN), so without the host check
(onnx2jax.input_checks) id 10,000 in a 256-token vocabulary gives an answer instead of an error.
Reference: onnxruntime's refusal; with the check off, onnxruntime's logits for the rows that are valid.
"""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import onnx2jax
from onnx2jax.cli.app import main
from onnx2jax.errors import InputRangeError

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"
VOCABULARY = 256


@pytest.fixture(scope="module")
def bad_ids() -> np.ndarray:
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"].copy()
    ids[1, 3] = 10_000
    return ids


def test_onnxruntime_refuses_them(bad_ids):
    session = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="out of"):
        session.run(None, {"input_ids": bad_ids})


def _refused(call, ids):
    with pytest.raises(InputRangeError) as raised:
        call(ids)
    error = raised.value
    assert (error.input, error.position, error.value, error.bound) == ("input_ids", (1, 3), 10_000, VOCABULARY)


def test_translate_refuses_every_call_not_only_the_first(bad_ids):
    model = onnx2jax.translate(LLAMA)
    good = np.clip(bad_ids, 0, VOCABULARY - 1)
    model(good)  # compiles; the next call takes the short path
    _refused(model, bad_ids)
    _refused(lambda ids: model(input_ids=ids), bad_ids)


def test_the_opt_out_skips_the_check(bad_ids):
    """check_indices=False: the call runs (the bad row's values are whatever XLA makes of the index)."""
    model = onnx2jax.translate(LLAMA, check_indices=False)
    (logits,) = model(bad_ids)
    session = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"input_ids": np.clip(bad_ids, 0, VOCABULARY - 1)})
    np.testing.assert_allclose(np.asarray(logits)[0], reference[0], rtol=1e-4, atol=1e-4)  # the good row


def test_compiled_sharded_refuses_on_the_short_path_too(bad_ids, tmp_path):
    path = tmp_path / "llama_tp2.onnx"
    assert main(["annotate", str(LLAMA), "--plan", "megatron", "--devices", "2", "-o", str(path)]) == 0
    compiled = onnx2jax.compile(str(path))
    compiled(np.clip(bad_ids, 0, VOCABULARY - 1))
    compiled(np.clip(bad_ids, 0, VOCABULARY - 1))  # the fast path now holds this signature
    _refused(compiled, bad_ids)


def test_pipeline_refuses_and_compile_takes_the_opt_out(bad_ids, tmp_path):
    path = tmp_path / "llama_pp.onnx"
    assert main(["annotate", str(LLAMA), "--stages", "auto:2", "--devices", "4", "--plan", "megatron", "-o", str(path)]) == 0
    _refused(onnx2jax.compile(str(path)), bad_ids)
    (logits,) = onnx2jax.compile(str(path), check_indices=False)(bad_ids)
    session = ort.InferenceSession(str(LLAMA), providers=["CPUExecutionProvider"])
    (reference,) = session.run(None, {"input_ids": np.clip(bad_ids, 0, VOCABULARY - 1)})
    np.testing.assert_allclose(np.asarray(logits)[0], reference[0], rtol=1e-4, atol=1e-4)  # the good row


def test_a_segmented_model_refuses(tmp_path):
    """Gather then NonZero (a data-dependent shape): the graph is cut, and the call still checks its ids."""
    import onnx
    import onnx.helper as oh
    import onnx.numpy_helper as onh

    graph = oh.make_graph(
        [oh.make_node("Gather", ["table", "ids"], ["rows"]), oh.make_node("NonZero", ["rows"], ["where"])],
        "g",
        [oh.make_tensor_value_info("ids", onnx.TensorProto.INT64, [4])],
        [oh.make_tensor_value_info("where", onnx.TensorProto.INT64, None)],
        [onh.from_array(np.eye(5, 3, dtype=np.float32), "table")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    ids = np.array([0, 1, 5, 2], np.int64)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="out of"):
        session.run(None, {"ids": ids})
    translated, compiled = onnx2jax.translate(model), onnx2jax.compile(model)
    assert translated.segments and isinstance(compiled, onnx2jax.SegmentedCompiled)
    for runner in (translated, compiled):
        with pytest.raises(InputRangeError, match=r"input 'ids' at \[2\] is 5, outside \[-5, 5\)"):
            runner(ids)
