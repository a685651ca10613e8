"""``onnx2jax export``: a jax.export artifact that runs without onnx or the translator (issue 22).

The artifact of tiny Llama TP 8 is written by the CLI, then loaded and called
in a fresh Python in which ``import onnx`` and the translator's modules fail;
its outputs equal onnxruntime's stored logits and the compiled model's, and
its parameters and outputs keep the compiled shardings. Exported with a
symbolic batch (unsharded and TP 8), one artifact serves batches 1 and 3
(tests/onnx2jax/test_export_symbolic.py: the zoo, the shape ops, the refusals).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import onnx
import onnxruntime
from zoo_cases import ZOO

import onnx2jax
from onnx2jax.cli import main
from onnx2jax.export import export, load
from sharding.megatron import megatron_plan

DATA = ZOO.parent
ROOT = DATA.parents[1]

_CHILD = textwrap.dedent(
    """
    import sys
    for blocked in ("onnx", "onnxruntime", "onnx2jax.translate", "onnx2jax.graph_runner", "onnx2jax.ops",
                    "onnx2jax.runtime", "sharding"):
        sys.modules[blocked] = None  # any import of these now raises ImportError
    import jax
    jax.config.update("jax_num_cpu_devices", 8)
    import numpy as np
    from onnx2jax.export import load
    artifact = load(sys.argv[1])
    (logits,) = artifact(np.load(sys.argv[2]))
    np.save(sys.argv[3], np.asarray(logits))
    """
)


def test_exported_artifact_runs_without_onnx_or_the_translator(tmp_path) -> None:
    annotated = tmp_path / "llama_tp8.onnx"
    onnx.save(megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8), annotated)
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    np.save(tmp_path / "ids.npy", ids)
    artifact = tmp_path / "llama.jaxexport"
    assert main(["export", str(annotated), "-o", str(artifact), "--input", f"input_ids={tmp_path / 'ids.npy'}"]) == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(artifact), str(tmp_path / "ids.npy"), str(tmp_path / "out.npy")],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logits = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(logits, np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"], rtol=1e-4, atol=1e-4)
    compiled = onnx2jax.compile(annotated, scan_layers="auto")
    (expected,) = compiled(ids)
    np.testing.assert_allclose(logits, np.asarray(expected), rtol=1e-6, atol=1e-6)
    loaded = load(artifact)
    (again,) = loaded(ids)
    assert again.sharding.is_equivalent_to(expected.sharding, again.ndim)
    for array, name in zip(loaded.params, compiled.params):
        assert array.sharding.is_equivalent_to(compiled.params[name].sharding, array.ndim), name


def _symbolic_batch_case(model: onnx.ModelProto) -> None:
    """Exported once with a symbolic batch, the artifact runs at batch 1 and 3: its logits equal
    onnxruntime's and the compiled model's at that batch, placed as the compiled model places them."""
    compiled = onnx2jax.compile(model, scan_layers=False)
    (batch,) = jax.export.symbolic_shape("batch")
    artifact = load(io.BytesIO(export(compiled, jax.ShapeDtypeStruct((batch, 16), np.int64))))
    session = onnxruntime.InferenceSession(str(DATA / "tiny_llama.onnx"), providers=["CPUExecutionProvider"])
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    for size in (1, 3):
        batch_ids = np.concatenate([ids, ids[::-1, ::-1]])[:size]
        (logits,) = artifact(batch_ids)
        assert logits.shape == (size, 16, 256)
        (reference,) = session.run(None, {"input_ids": batch_ids})
        np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)
        (expected,) = compiled(batch_ids)
        np.testing.assert_allclose(np.asarray(logits), np.asarray(expected), rtol=1e-5, atol=1e-5)
        assert logits.sharding.is_equivalent_to(expected.sharding, logits.ndim)
    for array, name in zip(artifact.params, compiled.params):
        assert array.sharding.is_equivalent_to(compiled.params[name].sharding, array.ndim), name


def test_a_symbolic_batch_is_kept_unsharded() -> None:
    _symbolic_batch_case(onnx.load(DATA / "tiny_llama.onnx"))


def test_a_symbolic_batch_is_kept_sharded() -> None:
    _symbolic_batch_case(megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8))


def test_the_cli_keeps_a_dim_symbolic(tmp_path, capsys) -> None:
    """``--dim batch=symbolic``: the artifact of tiny Llama TP 8 runs at batch 3 (not the inputs' 2), equal to
    onnxruntime. One batch is enough here: that one artifact runs at several batches, placed as the compiled
    model, is `test_a_symbolic_batch_is_kept_sharded`'s; a second batch would compile the TP 8 program again."""
    annotated = tmp_path / "llama_tp8.onnx"
    onnx.save(megatron_plan(onnx.load(DATA / "tiny_llama.onnx"), 8), annotated)
    artifact = tmp_path / "llama.jaxexport"
    assert main(["export", str(annotated), "-o", str(artifact), "--dim", "batch=symbolic", "--dim", "seq=16"]) == 0
    assert "input_ids [batch, 16]" in capsys.readouterr().out
    loaded = load(artifact)
    session = onnxruntime.InferenceSession(str(DATA / "tiny_llama.onnx"), providers=["CPUExecutionProvider"])
    ids = np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]
    batch_ids = np.concatenate([ids, ids[::-1]])[:3]
    assert len(ids) != 3 and len(batch_ids) == 3
    (logits,) = loaded(batch_ids)
    np.testing.assert_allclose(np.asarray(logits), session.run(None, {"input_ids": batch_ids})[0], rtol=1e-4, atol=1e-4)


def test_the_cli_refuses_an_unknown_symbolic_dim(tmp_path, capsys) -> None:
    assert main(["export", str(DATA / "tiny_llama.onnx"), "-o", str(tmp_path / "x.jaxexport"), "--dim", "width=symbolic"]) != 0
    assert "no symbolic dim 'width'" in capsys.readouterr().err


def test_the_cli_takes_constraints_on_symbolic_dims(tmp_path) -> None:
    """tiny BERT with batch and seq symbolic needs ``seq <= 64`` (its 64 positions): refused without it."""
    bert = DATA / "tiny_bert.onnx"
    artifact = tmp_path / "bert.jaxexport"
    symbolic = ["--dim", "batch=symbolic", "--dim", "seq=symbolic"]
    assert main(["export", str(bert), "-o", str(artifact), *symbolic]) != 0
    assert main(["export", str(bert), "-o", str(artifact), *symbolic, "--constraint", "seq <= 64"]) == 0
    session = onnxruntime.InferenceSession(str(bert), providers=["CPUExecutionProvider"])
    feeds = {k: v[:1, :5] for k, v in np.load(DATA / "tiny_bert.inputs.npz").items()}
    for out, ref in zip(load(artifact)(**feeds), session.run(None, feeds)):
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-4, atol=1e-4)
