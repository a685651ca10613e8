"""``onnx2jax.load``: a decoder loaded once (issue 28). The work of a sharded load counted by wrapping the
functions that do it (one translation, one shape inference, one sharding inference before the first token, no
protobuf copy of the weights, every weight a view of its file); a second ``generate(path)`` compiles nothing; a dropped handle is freed at once. Tokens
against onnxruntime-genai's / transformers' STORED greedy tokens (tests/data/genai/README.md)."""

import gc
import json
import pathlib
import shutil
import weakref

import numpy as np
import onnx
import onnx.external_data_helper
import onnx.shape_inference
import onnxruntime as ort
import pytest

import onnx2jax
import onnx2jax.runtime.generate as generate_module
import onnx2jax.runtime.plan as plan_module
from onnx2jax.loading import file_identity
from onnx2jax.runtime.decoder import Decoder
from onnx2jax.runtime.executable import Executable
from onnx2jax.translate import JaxModel

GENAI = pathlib.Path(__file__).parents[1] / "data" / "genai"
TORCH = GENAI / "llama_gqa_torch"
PAD = 3  # expected_tokens.json's pad_token_id (the torch export has no genai_config.json)


def expected(folder: pathlib.Path) -> dict:
    return json.loads((folder / "expected_tokens.json").read_text())


@pytest.fixture(scope="module")
def external_torch(tmp_path_factory) -> pathlib.Path:
    """The torch export with its weights in external data (as real-size exports have them)."""
    folder = tmp_path_factory.mktemp("llama_gqa_torch_external")
    model = onnx.load(TORCH / "model.onnx")
    onnx.save(model, folder / "model.onnx", save_as_external_data=True, location="model.onnx.data",
              size_threshold=0)
    shutil.copy(TORCH / "expected_tokens.json", folder)
    return folder


class Counts:
    """Calls of the functions that do a load's work, counted while the test runs."""

    def __init__(self, monkeypatch):
        self.translations = self.shape_inferences = self.proto_copies = self.tensor_reads = 0
        self.sharding_inferences = 0
        translate_init = JaxModel.__init__
        infer_shapes = onnx.shape_inference.infer_shapes
        deepcopy = onnx.ModelProto.__deepcopy__
        copy_from = onnx.ModelProto.CopyFrom
        read_tensor = onnx.external_data_helper.load_external_data_for_tensor
        infer_sharding = plan_module.infer  # sharding.stage_infer.infer: the plan's and each call's shapes'

        def counted_init(model, *args, **kwargs):
            self.translations += 1
            return translate_init(model, *args, **kwargs)

        def counted_inference(*args, **kwargs):
            self.shape_inferences += 1
            return infer_shapes(*args, **kwargs)

        def counted_deepcopy(proto, memo):
            self.proto_copies += 1
            return deepcopy(proto, memo)

        def counted_copy_from(proto, other):
            self.proto_copies += 1
            return copy_from(proto, other)

        def counted_read(tensor, base_dir):
            if tensor.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
                self.tensor_reads += 1
            return read_tensor(tensor, base_dir)

        def counted_sharding(*args, **kwargs):
            self.sharding_inferences += 1
            return infer_sharding(*args, **kwargs)

        monkeypatch.setattr(JaxModel, "__init__", counted_init)
        monkeypatch.setattr(plan_module, "infer", counted_sharding)
        monkeypatch.setattr(onnx.shape_inference, "infer_shapes", counted_inference)
        monkeypatch.setattr(onnx.ModelProto, "__deepcopy__", counted_deepcopy, raising=False)
        monkeypatch.setattr(onnx.ModelProto, "CopyFrom", counted_copy_from)
        monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_tensor", counted_read)


def test_a_sharded_load_translates_once_infers_shapes_once_and_copies_no_weight(external_torch, monkeypatch):
    counts = Counts(monkeypatch)
    work = lambda: (counts.translations, counts.shape_inferences, counts.sharding_inferences,  # noqa: E731
                    counts.proto_copies, counts.tensor_reads)
    model = onnx2jax.load(external_torch, devices=2)
    assert work() == (1, 1, 0, 0, 0)  # the sharding inference waits for the first prefill's shapes
    # every weight is a view of its file's map: no host copy before placement
    floats = {k: v for k, v in model.model.params.items() if v.dtype.kind == "f" and v.size > 1}
    assert floats and all(file_identity(v) is not None for v in floats.values())
    want = expected(external_torch)
    first = onnx2jax.Generator(model, want["prompts"], max_length=want["max_length"], pad_token_id=PAD)
    first.generate_next_token()
    # the first token: one sharding inference (the plan's, at the prefill's shapes; the prefill's call reuses
    # it) with the ONNX shape inference at those shapes
    assert work() == (1, 2, 1, 0, 0)
    got = onnx2jax.generate(model, want["prompts"], max_length=want["max_length"], pad_token_id=PAD)
    assert got.tolist() == want["batch_left_padded"]["tokens"]
    # the decode step's shapes: one inference more; nothing translated
    assert work() == (1, 3, 2, 0, 0)
    assert model.traces == {"prefill": 1, "decode": 1, "recompute": 0}


def test_a_second_generate_of_a_path_compiles_nothing(monkeypatch):
    counts = Counts(monkeypatch)
    want = expected(TORCH)
    for prompt, tokens in zip(want["prompts"][:2], want["tokens"][:2]):
        got = onnx2jax.generate(TORCH, prompt, max_length=want["max_length"], pad_token_id=PAD)
        assert got.tolist() == [tokens]
    assert counts.translations == 1
    (handle,) = generate_module._RECENT
    assert handle.traces["decode"] == 1  # the second call's decode ran the first call's program
    assert onnx2jax.load(TORCH) is handle  # the same path, devices and mesh: the same handle
    assert onnx2jax.load(TORCH, devices=2) is not handle
    generate_module._RECENT.clear()


def test_a_dropped_handle_is_freed_without_a_garbage_collection():
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        model = onnx2jax.load(TORCH, devices=2)
        onnx2jax.generate(model, [1, 42, 7], max_new_tokens=20)
        handle, compiled = weakref.ref(model), weakref.ref(model.compiled)
        del model
        assert handle() is None and compiled() is None  # no reference cycle: freed when the last reference goes
        assert onnx2jax.load(TORCH, devices=2) is not None  # loaded anew (the remembered one is gone)
    finally:
        if was_enabled:
            gc.enable()


def test_the_handle_is_an_executable_whose_forward_equals_onnxruntime():
    model = onnx2jax.load(TORCH)
    assert isinstance(model, Decoder) and isinstance(model, Executable)
    assert onnx2jax.load(model) is model
    with pytest.raises(ValueError, match="devices/mesh are fixed when the model is loaded"):
        onnx2jax.Generator(model, [1, 2], max_new_tokens=2, devices=2)
    session = ort.InferenceSession(str(TORCH / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 42, 7, 99]], np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(4)[None]}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros((1, 2, 0, 16), np.float32)
    want = session.run(["logits"], feeds)[0]
    names = model.model.output_names
    got = np.asarray(model(**feeds)[names.index("logits")])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # value_and_grad (the protocol's): the logits are linear in the final norm's weight, so onnxruntime's
    # central difference along a random direction is its gradient's projection up to float32 rounding.
    norm, weights = "lm.model.norm.weight", np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)
    loss, grads = model.value_and_grad(lambda outputs, w: (outputs[names.index("logits")] * w).sum())(
        {norm: model.params[norm]}, **feeds, loss_args=(weights,))
    proto, step = onnx.load(TORCH / "model.onnx"), np.random.default_rng(2).standard_normal(128).astype(np.float32)
    initializer = next(t for t in proto.graph.initializer if t.name == norm)
    base = onnx.numpy_helper.to_array(initializer)

    def ort_loss(value):
        initializer.CopyFrom(onnx.numpy_helper.from_array(value.astype(np.float32), norm))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        run = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return float((run.run(["logits"], feeds)[0].astype(np.float64) * weights).sum())

    np.testing.assert_allclose(float(loss), ort_loss(base), rtol=1e-4)
    central = (ort_loss(base + 0.5 * step) - ort_loss(base - 0.5 * step)) / 1.0
    np.testing.assert_allclose(float(np.dot(np.asarray(grads[norm]), step)), central, rtol=1e-4)
