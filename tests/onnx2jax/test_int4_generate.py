"""The int4 builder fixture (tests/data/genai/llama_gqa_int4) through the int4 CPU kernel, on 1 and 8 devices.

* tokens: greedy generation equals onnxruntime-genai's stored tokens (expected_tokens.json);
* the kernel is what runs: its custom call is in the compiled prefill and decode programs, sharded too,
  and no float copy of any weight ([N, K] or [K, N] float32 for a MatMulNBits of the model) is in them;
* collectives: those of the same model traced through the pure-JAX path (what XLA's partitioner does with
  the unpacking and the dot): running the kernel per device (custom_partitioning) adds none;
* parameter bytes per device, measured from the placed arrays: the packed bytes, i.e. each initializer's
  bytes in the ONNX file over the number of devices its placement splits it over (1 on one device).
"""

import json
import pathlib
import re
from collections import Counter

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import onnx2jax
from onnx2jax.ops import nbits_kernel
from onnx2jax.ops.contrib_quantization import portable
from onnx2jax.runtime.decoder import Decoder
from onnx2jax.runtime.generate import Generator, _pad

FOLDER = pathlib.Path(__file__).parents[1] / "data" / "genai" / "llama_gqa_int4"
PAD = 3
COLLECTIVES = "all-reduce|all-gather|all-to-all|collective-permute|reduce-scatter"

pytestmark = pytest.mark.skipif(not nbits_kernel.available(), reason="the int4 kernel was not built")


def _expected() -> dict:
    return json.loads((FOLDER / "expected_tokens.json").read_text())


def _weight_shapes() -> set[str]:
    """The float32 [N, K] and [K, N] tensor types of every MatMulNBits weight of the model, as HLO spells them,
    but for shapes a float initializer has too (the embedding table [vocab, hidden] is the LM head's [N, K])."""
    model = onnx.load(FOLDER / "model.onnx", load_external_data=False)
    shapes = set()
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            shapes |= {f"f32[{attrs['N']},{attrs['K']}]", f"f32[{attrs['K']},{attrs['N']}]"}
    floats = {f"f32[{','.join(map(str, t.dims))}]" for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return shapes - floats


def _programs(decoder: Decoder) -> str:
    """The compiled prefill and decode programs' HLO (a prompt of 3, then one step), as Generator calls them."""
    generator = Generator(decoder, [1, 42, 7], max_new_tokens=4)
    with decoder.x64():
        capacity = decoder.buffer_capacity(generator.max_length)
        ids, lengths = _pad(generator.prompts, decoder.prefill_width(generator.width, capacity), generator.pad,
                            decoder.layout.padding)
        prefill = decoder.prefill(generator.search).lower(
            decoder.params, decoder.empty_cache(generator.batch, capacity), ids, lengths, generator._sampling()
        ).compile().as_text()
    generator.generate_next_token()
    with decoder.x64():
        decode = decoder.decode(generator.search).lower(
            decoder.params, generator._cache, generator._state, generator._token, np.int32(1)
        ).compile().as_text()
    return prefill + decode


@pytest.mark.parametrize("devices", [1, 8])
def test_int4_tokens_equal_onnxruntime_genai(devices):
    decoder = onnx2jax.load(FOLDER, devices=devices)
    want = _expected()
    got = onnx2jax.generate(decoder, want["prompts"], max_length=want["max_length"], pad_token_id=PAD)
    assert got.tolist() == want["batch_right_padded"]["tokens"]


# one device (no collective to compare) repeats what 8 show: slow
@pytest.mark.parametrize("devices", [pytest.param(1, marks=pytest.mark.slow), 8])
def test_the_kernel_runs_per_device_with_no_float_weight_and_no_extra_collective(devices):
    programs = _programs(onnx2jax.load(FOLDER, devices=devices))  # the handle is dropped after this line
    assert nbits_kernel.TARGET in programs
    assert not {s for s in _weight_shapes() if s in programs}
    with portable():  # a new handle (the first was dropped: load keeps none), traced through the pure-JAX path
        pure = _programs(onnx2jax.load(FOLDER, devices=devices))
    assert nbits_kernel.TARGET not in pure
    assert _weight_shapes() & {s for s in _weight_shapes() if s in pure}  # the check above can fail
    count = lambda text: Counter(re.findall(rf"= \S+ ({COLLECTIVES})(?:-start)?\(", text))  # noqa: E731
    assert count(programs) == count(pure)


@pytest.mark.parametrize("devices", [1, 8])
def test_parameter_bytes_per_device_are_the_packed_bytes(devices):
    model = onnx.load(FOLDER / "model.onnx")
    stored = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    decoder = onnx2jax.load(FOLDER, devices=devices)
    packed = [name for name in decoder.params if name.endswith("_Q4")]
    assert len(packed) == 11  # every MatMulNBits weight (2 layers x 5 + the LM head) is a parameter
    per_device, expected = 0, 0
    for name, array in decoder.params.items():
        per_device += array.addressable_shards[0].data.nbytes  # the first device's shard
        spec, mesh = getattr(array.sharding, "spec", ()), getattr(array.sharding, "mesh", None)
        ways = int(np.prod([mesh.shape[a] for entry in spec if entry
                            for a in (entry if isinstance(entry, tuple) else (entry,))]))
        assert array.dtype == stored[name].dtype and array.shape == stored[name].shape, name
        expected += stored[name].nbytes // ways
    assert per_device == expected
    if devices == 1:
        assert per_device == sum(stored[name].nbytes for name in decoder.params)
    else:  # the split packed weights are smaller on each device than whole
        assert per_device < sum(stored[name].nbytes for name in decoder.params)


def test_export_traces_the_portable_path():
    """A ``jax.export`` artifact holds no custom call of ours (it runs with jax alone): export traces MatMulNBits
    through the pure-JAX path, and the loaded artifact gives onnxruntime's stored outputs of the same call (as
    the kernel does; the two paths round differently, within 3e-5 of each other on these logits)."""
    from onnx2jax.export import export, load

    model = onnx.load(FOLDER / "model.onnx")
    stored = np.load(FOLDER / "forward.npz")
    inputs = {k: stored[k] for k in stored.files if not k.startswith("out:")}
    compiled = onnx2jax.compile(model)
    data = export(compiled, **inputs)
    assert nbits_kernel.TARGET.encode() not in data
    artifact = load(_write(data))
    names = [o.name for o in model.graph.output]
    for name, got, kernel in zip(names, artifact(**inputs), compiled(**inputs)):
        want = stored[f"out:{name}"]
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4, err_msg=name)
        np.testing.assert_allclose(np.asarray(kernel), want, rtol=1e-4, atol=1e-4, err_msg=name)


def _write(data: bytes) -> pathlib.Path:
    import tempfile

    path = pathlib.Path(tempfile.mkdtemp()) / "int4.onnx2jax"
    path.write_bytes(data)
    return path
