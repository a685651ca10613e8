"""Real-size models (issue 21): weights stay in their external data, a model past 2 GB, copies counted.

The mechanisms on small models with external data: ``annotate`` writes a
small .onnx that reads the source's data (or new numbered files), ``check``
and ``annotate`` never read tensor data (a sparse model past 2 GB), and
placing a weight or a stack of layer weights never makes a whole host copy
(tracemalloc: numpy's allocations are traced).
"""

from __future__ import annotations

import os
import re
import tracemalloc
from pathlib import Path

import jax
import numpy as np
import onnx
import onnx.helper as oh
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import onnx2jax
import onnx2jax.loading
from onnx2jax.cli.app import main
from onnx2jax.placing import place, place_stacked


def _external(name: str, shape: tuple[int, ...], location: str, offset: int) -> onnx.TensorProto:
    tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=list(shape))
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(int(np.prod(shape)) * 4))):
        tensor.external_data.add(key=key, value=value)
    return tensor


def _two_matmuls(folder: Path, n: int, weights: list[np.ndarray] | None) -> Path:
    """``y = relu(x @ w1) @ w2`` with both weights in ``weights.bin`` (zeros by truncate when None)."""
    data = folder / "weights.bin"
    size = n * n * 4
    with open(data, "wb") as f:
        if weights is None:
            f.truncate(2 * size)
        else:
            for w in weights:
                f.write(np.ascontiguousarray(w, np.float32).tobytes())
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
            oh.make_node("Relu", ["h"], ["r"], name="relu"),
            oh.make_node("MatMul", ["r", "w2"], ["y"], name="mm2"),
        ],
        "two",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, n])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, n])],
        [_external("w1", (n, n), data.name, 0), _external("w2", (n, n), data.name, size)],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    path = folder / "two.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def _reference(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    return np.maximum(x.astype(np.float64) @ w1, 0) @ w2


@pytest.fixture
def small_external(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    return _two_matmuls(tmp_path, 64, [w1, w2]), w1, w2


def test_annotate_writes_a_small_model_beside_the_source_data(small_external, tmp_path: Path):
    path, w1, w2 = small_external
    out = tmp_path / "two.tp8.onnx"
    assert main(["annotate", str(path), "--plan", "megatron", "--devices", "8", "-o", str(out)]) == 0
    assert out.stat().st_size < 4096  # the graph and annotations only
    written = onnx.load(str(out), load_external_data=False)
    assert {e.value for t in written.graph.initializer for e in t.external_data if e.key == "location"} == {"weights.bin"}
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    (y,) = onnx2jax.compile(str(out))(x)
    np.testing.assert_allclose(np.asarray(y), _reference(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_annotate_into_another_folder_refuses_or_copies_in_numbered_files(small_external, tmp_path: Path, capsys):
    path, w1, w2 = small_external
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = elsewhere / "two.tp8.onnx"
    argv = ["annotate", str(path), "--plan", "megatron", "--devices", "8", "-o", str(out)]
    assert main(argv) != 0
    assert "outside the output's directory" in capsys.readouterr().err + capsys.readouterr().out or not out.exists()
    assert not out.exists()
    assert main([*argv, "--external-data-size", "20000"]) == 0  # 16 KiB per weight: one file each
    files = sorted(p.name for p in elsewhere.iterdir())
    assert files == ["two.tp8.0.data", "two.tp8.1.data", "two.tp8.onnx"]
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    (y,) = onnx2jax.compile(str(out))(x)
    np.testing.assert_allclose(np.asarray(y), _reference(x, w1, w2), rtol=1e-4, atol=1e-4)


def test_a_model_past_2gb_annotates_and_checks_without_reading_its_data(tmp_path: Path, monkeypatch):
    n = 16400  # two [16400, 16400] float32 weights: 2.15 GB of zeros in a sparse file
    path = _two_matmuls(tmp_path, n, None)
    assert os.path.getsize(tmp_path / "weights.bin") > 2**31
    read = []
    monkeypatch.setattr(np, "memmap", lambda *a, **k: read.append(a) or pytest.fail("tensor data was mapped"))
    monkeypatch.setattr(
        onnx.external_data_helper, "load_external_data_for_tensor", lambda *a, **k: pytest.fail("tensor data was read")
    )
    out = tmp_path / "two.tp8.onnx"
    assert main(["annotate", str(path), "--plan", "megatron", "--devices", "8", "-o", str(out)]) == 0
    assert out.stat().st_size < 4096
    assert main(["check", str(out)]) == 0
    completed = tmp_path / "two.completed.onnx"
    assert main(["explain", str(out), "--write", str(completed)]) == 0
    assert completed.stat().st_size < 8192
    assert not read


def _weight_file(tmp_path: Path, shape: tuple[int, ...], seed: int = 0) -> np.memmap:
    array = np.random.default_rng(seed).standard_normal(shape, np.float32)
    file = tmp_path / f"w{seed}.bin"
    array.tofile(file)
    del array
    return np.memmap(file, np.float32, "r", shape=shape)


def _host_peak_over_kept(make) -> tuple[int, object]:
    """(peak traced host bytes beyond what stays allocated afterwards, make's result)."""
    tracemalloc.start()
    try:
        result = make()
        _, peak = tracemalloc.get_traced_memory()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - current, result


def test_placing_a_sharded_weight_makes_no_whole_host_copy(tmp_path: Path):
    """100 MB, split unevenly over 8 devices (held padded): each device's slice is read from the map."""
    weight = _weight_file(tmp_path, (5003, 5000))
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x", None))
    extra, placed = _host_peak_over_kept(lambda: place(weight, sharding, (5008, 5000)))
    assert extra < weight.nbytes / 8  # at most one slice in flight, never the whole weight
    expected = np.pad(np.asarray(weight), [(0, 5), (0, 0)])
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index])


def test_stacked_layers_are_stacked_per_device_slice(tmp_path: Path):
    """Four 25 MB layer weights stacked for a scan, column-split over 8 devices: no np.stack host copy."""
    layers = [_weight_file(tmp_path, (2500, 2504), seed) for seed in range(4)]
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec(None, None, "x"))
    extra, placed = _host_peak_over_kept(lambda: place_stacked(layers, sharding))
    total = sum(layer.nbytes for layer in layers)
    assert extra < total / 8
    expected = np.stack([np.asarray(layer) for layer in layers])
    for shard in placed.addressable_shards:
        np.testing.assert_array_equal(np.asarray(shard.data), expected[shard.index])


def _layers_model(tmp_path: Path) -> tuple[Path, list[np.ndarray]]:
    """Four ``tanh(x @ w_k)`` layers, their weights in one external data file."""
    rng = np.random.default_rng(0)
    width, layers = 32, 4
    weights = [rng.standard_normal((width, width)).astype(np.float32) * 0.3 for _ in range(layers)]
    data = tmp_path / "layers.bin"
    with open(data, "wb") as f:
        for w in weights:
            f.write(w.tobytes())
    nodes, inits, x = [], [], "x"
    for k in range(layers):
        inits.append(_external(f"w{k}", (width, width), data.name, k * width * width * 4))
        nodes += [oh.make_node("MatMul", [x, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  oh.make_node("Tanh", [f"m{k}"], [f"h{k}"], name=f"tanh{k}")]
        x = f"h{k}"
    graph = oh.make_graph(
        nodes, "layers", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, width])],
        [oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [2, width])], inits,
    )
    path = tmp_path / "layers.onnx"
    path.write_bytes(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]).SerializeToString())
    return path, weights


def test_scanned_model_from_external_data_matches_the_unrolled_run(tmp_path: Path):
    """The stacked copy built per device slice from the memory maps runs like the per-layer weights."""
    path, weights = _layers_model(tmp_path)
    inputs = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    expected = inputs.astype(np.float64)
    for w in weights:
        expected = np.tanh(expected @ w)
    model = onnx2jax.translate(str(path), scan_layers=True)
    assert isinstance(model.params["w0"], np.memmap)
    (y,) = model(inputs)
    assert model.scan.active
    np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5)


def test_auto_unrolls_layers_whose_weights_a_scan_would_copy_on_every_call(tmp_path: Path, monkeypatch):
    """Past AUTO_MAX_STACKED_BYTES, "auto" keeps the layers unrolled and says why (measured: +70% per call)."""
    import onnx2jax.scan

    path, _ = _layers_model(tmp_path)
    monkeypatch.setattr(onnx2jax.scan, "AUTO_MIN_LAYERS", 2)
    assert onnx2jax.translate(str(path)).scan.active  # 16 KiB of layer weights: scanned
    monkeypatch.setattr(onnx2jax.scan, "AUTO_MAX_STACKED_BYTES", 8 << 10)
    model = onnx2jax.translate(str(path))
    assert not model.scan.active
    assert "hold 0 MiB of parameters, more than 0 MiB: a scan would copy each layer's" in model.layers_report()


def test_drop_pages_keeps_the_values(tmp_path: Path):
    weight = _weight_file(tmp_path, (256, 256))
    before = np.array(weight)
    onnx2jax.loading.drop_pages(weight[10:])
    np.testing.assert_array_equal(np.asarray(weight), before)


def test_a_vocabulary_the_devices_do_not_divide_is_split_unevenly_not_replicated(tmp_path: Path, capsys):
    """GPT-2's 50,257 on 8 in small: a vocabulary of 251 (prime) split over 8, held padded; values as unsharded.

    The logits [2, 16, 251] cannot come back split on the vocabulary (JAX holds no uneven array): they come
    back split 8 ways on the sequence, one all-to-all of each device's 1/8 of the padded logits (8 pieces of
    [2, 2, 32] floats, 4,096 bytes), where replicating them all-gathered the whole [2, 16, 256] onto every
    device (32 kB each, and 8 copies of the logits in the process)."""
    import sys

    from onnx2jax.runtime.report import count_collectives

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import medium_transformers as mt

    config = mt.Config(layers=2, width=64, heads=8, kv_heads=8, ffn=128, vocab=251, positions=64)
    path = tmp_path / "gpt2.onnx"
    onnx.save(mt.build("gpt2", config), path)
    out = tmp_path / "gpt2.tp8.onnx"
    assert main(["annotate", str(path), "--plan", "megatron", "--devices", "8", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "vocabulary 251 split unevenly over 8 devices (32 rows each, the last 27" in printed
    compiled = onnx2jax.compile(str(out))
    table = compiled.params["wte"]
    assert table.shape == (256, 64) and table.sharding.spec[0] is not None  # padded, split: not replicated
    assert {s.data.shape for s in table.addressable_shards} == {(32, 64)}
    feeds = mt.inputs("gpt2", 2, 16, config)
    (expected,) = onnx2jax.translate(str(path))(**feeds)
    with pytest.warns(UserWarning, match=r"'logits' \[2, 16, 251\]: its spec splits axis 2 \(251\) over mesh axes "
                      r"\['d0'\], which do not divide it evenly .* so it comes back split on axis 1 instead"):
        (logits,) = compiled(**feeds)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=1e-4, atol=1e-4)
    shards = sorted(logits.addressable_shards, key=lambda s: s.index[1].start)
    assert len(shards) == 8 and [s.index[1] for s in shards] == [slice(2 * k, 2 * k + 2) for k in range(8)]
    assert all(s.data.shape == (2, 2, 251) for s in shards)
    for shard in shards:
        np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(logits)[shard.index])
    text = compiled.compiled_text(**feeds)
    counts = count_collectives(text)
    assert (counts["all-to-all"], counts["all-gather"], counts["all-reduce"]) == (1, 0, 5)  # 1 lookup + 4 row-parallel
    (line,) = [line for line in text.splitlines() if " all-to-all(" in line]
    pieces = re.findall(r"f32\[([0-9,]+)\]", line.split(" all-to-all(")[0])
    assert pieces == ["2,1,2,32"] * 8  # each device's [2, 16, 32] block of the padded logits, cut 8 ways
    assert sum(4 * int(np.prod([int(d) for d in p.split(",")])) for p in pieces) == 4096


class _Reads:
    """An array that records the slices read from it (what a process reads from the file)."""

    def __init__(self, array: np.ndarray):
        self.array, self.shape, self.dtype, self.ndim = array, array.shape, array.dtype, array.ndim
        self.read: list[int] = []

    def __getitem__(self, index):
        part = self.array[index]
        self.read.append(part.nbytes)
        return part


@pytest.mark.parametrize(("spec", "reads"), [(PartitionSpec("x", None), 8), (PartitionSpec(), 1)])
def test_placing_reads_each_devices_slice_once_and_nothing_else(spec, reads):
    """Split 8 ways: eight reads of 1/8 (a process reads only its addressable devices' slices, as
    jax.make_array_from_callback asks for no other); replicated: one read, shared by the devices."""
    weight = _Reads(np.arange(64 * 16, dtype=np.float32).reshape(64, 16))
    mesh = Mesh(np.array(jax.devices()[:8]), ("x",))
    placed = place(weight, NamedSharding(mesh, spec))
    assert len(weight.read) == reads and sum(weight.read) == weight.array.nbytes
    np.testing.assert_array_equal(np.asarray(placed), weight.array)


def test_a_tied_embedding_in_two_pipeline_stages_is_held_once(tmp_path: Path, capsys):
    """GPT-2's tied table in both stages of ``auto:2`` (the lookup, the head), 4 devices each: each stage's
    device k holds the same host bytes as the other's (one map of the file per process; a padded or
    copied slice placed once and aliased by both), so the process holds the table once, not twice.
    The logits (vocabulary 251 over 4) come back split on the sequence; values equal the unsharded run."""
    import sys

    from onnx2jax.runtime.report import count_collectives

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    import medium_transformers as mt

    config = mt.Config(layers=2, width=64, heads=8, kv_heads=8, ffn=128, vocab=251, positions=64)
    path = tmp_path / "gpt2.onnx"
    onnx.save(mt.build("gpt2", config), path, save_as_external_data=True, location="gpt2.data", size_threshold=0)
    out = tmp_path / "gpt2.pp.onnx"
    argv = ["annotate", str(path), "--name-nodes", "--stages", "auto:2", "--plan", "megatron", "--devices", "8"]
    assert main(argv + ["-o", str(out)]) == 0
    capsys.readouterr()
    pipeline = onnx2jax.compile(str(out))
    tables = [stage.compiled.params["wte"] for stage in pipeline.stages]
    assert [t.shape for t in tables] == [(252, 64), (252, 64)]  # 251 rows over 4, held padded
    pointers = [
        [s.data.unsafe_buffer_pointer() for s in sorted(t.addressable_shards, key=lambda s: s.index[0].start)]
        for t in tables
    ]
    assert len(set(pointers[0])) == 4 and pointers[0] == pointers[1]  # the padded last slice too
    assert {s.device.id for s in tables[0].addressable_shards}.isdisjoint(s.device.id for s in tables[1].addressable_shards)
    feeds = mt.inputs("gpt2", 2, 16, config)
    (expected,) = onnx2jax.translate(str(path))(**feeds)
    with pytest.warns(UserWarning, match="'logits' .* comes back split on axis 1 instead"):
        (logits,) = pipeline(**feeds)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=1e-4, atol=1e-4)
    assert {s.data.shape for s in logits.addressable_shards} == {(2, 4, 251)}
    last = count_collectives(pipeline.lower(**feeds)[-1].compile().as_text())
    assert (last["all-to-all"], last["all-gather"]) == (1, 0)  # the logits' move; nothing gathers them whole


def test_a_tensor_is_mapped_once_per_process_until_its_file_changes(tmp_path: Path):
    """Two reads of one external tensor share one map (its pages count once); a rewritten file is mapped anew."""
    from onnx2jax.loading import initializer_array

    rng = np.random.default_rng(1)
    path = _two_matmuls(tmp_path, 16, [rng.standard_normal((16, 16)) for _ in range(2)])
    tensor = onnx.load(str(path), load_external_data=False).graph.initializer[0]
    first, again = initializer_array(tensor, str(tmp_path)), initializer_array(tensor, str(tmp_path))
    assert first is again
    new = np.arange(2 * 16 * 16, dtype=np.float32)
    (tmp_path / "weights.bin").unlink()
    (tmp_path / "weights.bin").write_bytes(new.tobytes())  # a new file: another inode
    changed = initializer_array(tensor, str(tmp_path))
    assert changed is not first
    np.testing.assert_array_equal(changed, new[:256].reshape(16, 16))
