"""Issue 24, item 1: every mistake of a user named, with the exit status the README gives it.

README (Command line): a mistake is one line on stderr with exit status 1, a malformed option 2.
References: onnxruntime's refusal of out-of-range ids; the model's declared input shapes.
"""

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from onnx2jax.cli.app import main

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = DATA / "tiny_gpt2.onnx"


def _error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in err + captured.out and "internal error" not in err, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"onnx2jax {command}: error: "), err
    return err


@pytest.fixture(scope="module")
def gpt2_ids() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "tiny_gpt2.inputs.npz"))


def _vocabulary() -> int:
    import onnx

    model = onnx.load(GPT2)
    sizes = {t.name: t.dims for t in model.graph.initializer}
    gather = next(n for n in model.graph.node if n.op_type == "Gather" and n.input[0] in sizes)
    return sizes[gather.input[0]][0]


def test_ids_beyond_the_vocabulary_are_refused_by_name(gpt2_ids, tmp_path, capsys):
    name = next(k for k in gpt2_ids if "ids" in k)
    ids = gpt2_ids[name].copy()
    vocabulary = _vocabulary()
    ids[0, 1] = vocabulary + 999
    feeds = {**gpt2_ids, name: ids}
    session = ort.InferenceSession(str(GPT2), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="out of"):  # the reference refuses these ids too
        session.run(None, feeds)
    np.savez(tmp_path / "bad.npz", **feeds)
    assert main(["run", str(GPT2), "--input", str(tmp_path / "bad.npz")]) == 1
    err = _error(capsys, "run")
    for part in (repr(name), "[0, 1]", str(vocabulary + 999), f"[{-vocabulary}, {vocabulary})"):
        assert part in err, err


def test_the_index_check_can_be_turned_off(gpt2_ids, tmp_path, capsys):
    name = next(k for k in gpt2_ids if "ids" in k)
    ids = gpt2_ids[name].copy()
    ids[0, 1] = _vocabulary() + 999
    np.savez(tmp_path / "bad.npz", **{**gpt2_ids, name: ids})
    assert main(["run", str(GPT2), "--input", str(tmp_path / "bad.npz"), "--no-check-indices"]) == 0


def test_wrong_rank_names_the_input_and_its_dims(gpt2_ids, tmp_path, capsys):
    name = next(k for k in gpt2_ids if "ids" in k)
    np.save(tmp_path / "ids3d.npy", gpt2_ids[name][None])
    assert main(["run", str(GPT2), "--input", f"{name}={tmp_path / 'ids3d.npy'}"]) == 1
    err = _error(capsys, "run")
    assert f"input {name!r}" in err and "rank 2" in err and "rank 3" in err, err


@pytest.fixture(scope="module")
def llama_tp2(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("annotated") / "llama_tp2.onnx"
    assert main(["annotate", str(DATA / "tiny_llama.onnx"), "--plan", "megatron", "--devices", "2", "-o", str(path)]) == 0
    return path


def test_check_input_shape_of_the_wrong_rank(llama_tp2, capsys):
    capsys.readouterr()
    assert main(["check", str(llama_tp2), "--input-shape", "input_ids=2"]) == 2
    err = _error(capsys, "check")
    assert "'input_ids' has rank 2" in err and "input_ids=" in err, err


def test_devices_zero_is_a_usage_error(llama_tp2, capsys):
    capsys.readouterr()
    assert main(["run", str(llama_tp2), "--devices", "0"]) == 2
    assert "--devices must be >= 1" in _error(capsys, "run")


def test_demo_devices_zero_is_a_usage_error(capsys):
    assert main(["demo", "--devices", "0"]) == 2
    assert "--devices must be >= 1" in _error(capsys, "demo")


def test_fewer_devices_than_the_configuration_is_a_user_error(llama_tp2, capsys):
    capsys.readouterr()
    assert main(["run", str(llama_tp2), "--devices", "1"]) == 1  # README: too few devices, exit status 1
    assert "needs 2 devices; pass --devices 2" in _error(capsys, "run")


def test_more_devices_than_the_configuration_says_what_it_used(llama_tp2, capsys):
    capsys.readouterr()
    assert main(["run", str(llama_tp2), "--devices", "8"]) == 0
    assert "running on 2 of the 8" in capsys.readouterr().out


def test_the_library_names_a_wrong_rank_as_the_users_mistake(gpt2_ids):
    import onnx

    import onnx2jax
    from onnx2jax.cli.errors import USER_ERROR_TYPES
    from onnx2jax.errors import InputError

    name = next(k for k in gpt2_ids if "ids" in k)
    declared = next(i for i in onnx.load(GPT2).graph.input if i.name == name)
    rank = len(declared.type.tensor_type.shape.dim)
    with pytest.raises(InputError, match=rf"input '{name}': expected rank {rank} ") as raised:
        onnx2jax.translate(GPT2)(gpt2_ids[name][None])
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, USER_ERROR_TYPES)


def test_identical_stage_lines_are_said_once():
    from onnx2jax.cli.summary import merged_stage_lines

    text = "stage 0: layers unrolled: why\nstage 1: layers unrolled: why\nstage 2: 2 layers as one lax.scan"
    assert merged_stage_lines(text) == ["stages 0, 1: layers unrolled: why", "stage 2: 2 layers as one lax.scan"]
    assert merged_stage_lines("layers unrolled: scan_layers=False") == ["layers unrolled: scan_layers=False"]


def test_run_is_short_by_default_and_says_each_note_once_when_verbose(llama_tp2, capsys):
    """Issue 24, item 3: headline figures by default; --verbose adds the tables; the layers note once."""
    capsys.readouterr()
    assert main(["run", str(llama_tp2), "--devices", "2"]) == 0
    short = capsys.readouterr().out.splitlines()
    assert len(short) <= 8, short
    assert sum("per call (mean of" in line for line in short) == 1  # one per-call time
    assert any(line.startswith("collectives per call: all-reduce") for line in short)
    assert main(["run", str(llama_tp2), "--devices", "2", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "PartitionSpec" in out and out.count("layers unrolled") == 1


@pytest.fixture(scope="module")
def llama_staged(tmp_path_factory) -> Path:
    """Tiny Llama in 2 pipeline stages of tensor parallel 4."""
    path = tmp_path_factory.mktemp("staged") / "llama_2x4.onnx"
    assert main(["annotate", str(DATA / "tiny_llama.onnx"), "--name-nodes", "--stages", "auto:2", "--plan", "megatron",
                 "--devices", "8", "-o", str(path)]) == 0
    return path


def test_a_pipelined_run_says_what_each_time_per_call_measures(llama_staged, capsys):
    """One mean time per call; the pipeline report's own call time is labelled as the bubble's measure.

    The printed call time must be the one the printed bubble fraction was computed from: the bubble is
    recomputed from the printed ms/mb and call time (to their rounding).
    """
    capsys.readouterr()
    assert main(["run", str(llama_staged), "--devices", "8", "--microbatches", "2", "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()
    timings = [line for line in lines if "per call" in line]
    assert len(timings) == 1 and re.search(r"then [\d.]+ ?m?s per call \(mean of \d+ calls back to back\)$", timings[0])
    assert not any(line.startswith("pipelined call") for line in lines)
    legend = next(line for line in lines if line.startswith("(bubble:"))
    call, again = re.fullmatch(
        r"\(bubble: 1 - M x sum\(ms/mb\) / \(S x ([\d.]+) ms\); ([\d.]+) ms: the pipelined call's best of 5, "
        r"each timed next to the stages\)", legend).groups()
    assert call == again
    summary = next(line for line in lines if line.startswith("bubble fraction"))
    bubble = float(re.match(r"bubble fraction ([\d.]+); fill-drain bound", summary).group(1))
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["stage", "nodes"])
    stage_ms = [float(lines[header + 1 + k].split()[-1]) for k in range(2)]
    m, s, t, busy, r = 2, 2, float(call), sum(stage_ms), 0.005  # r: half the last printed digit
    low = 1 - m * (busy + s * r) / (s * (t - r))
    high = 1 - m * (busy - s * r) / (s * (t + r))
    assert low - 5e-4 <= bubble <= high + 5e-4, (bubble, low, high, lines)
