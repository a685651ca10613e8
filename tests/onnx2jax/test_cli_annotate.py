"""`onnx2jax annotate`: plan, --spec and --stage, written files read back."""

from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from onnx2jax.cli.app import main
from sharding.model_configs import read_model_configs
from sharding.text import format_spec

DATA = Path(__file__).resolve().parents[1] / "data"


def _written(path: Path) -> dict[tuple[str, str], str]:
    model = onnx.load(path)
    return {
        (node, spec.tensor_name): format_spec(spec)
        for by_node in read_model_configs(model).values()
        for node, config in by_node.items()
        for spec in config.specs
    }


@pytest.fixture
def small(tmp_path: Path) -> Path:
    graph = oh.make_graph(
        [
            oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            oh.make_node("Relu", ["h"], ["y"], name="relu"),
        ],
        "small",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6])],
        [onh.from_array(np.ones((4, 6), np.float32), "W")],
    )
    path = tmp_path / "small.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), path)
    return path


def test_megatron_plan_on_gpt2(tmp_path: Path, capsys):
    out = tmp_path / "gpt2_tp.onnx"
    argv = ["annotate", str(DATA / "tiny_gpt2.onnx"), "--plan", "megatron", "--devices", "8", "-o", str(out)]
    assert main(argv) == 0
    summary = capsys.readouterr().out
    assert len(summary.splitlines()) <= 4, summary  # quiet by default: notes and one line saying what was written
    assert f"wrote {out}: 40 annotations on 11 nodes ('tp' on 8 devices)" in summary
    assert "2 attention and 2 MLP column/row pairs, LM head node_linear" in summary
    code = main([*argv, "--verbose"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "1:(3x1,64x8) @ [0,1,2,3,4,5,6,7]" in printed
    assert "L1 mlp row" in printed
    assert "2 attention and 2 MLP column/row pairs, LM head node_linear" in printed
    written = _written(out)
    assert written[("node_addmm", "model.transformer.h.0.attn.c_attn.weight")] == "1:(3x1,64x8) @ [0,1,2,3,4,5,6,7]"
    assert [(c.name, c.num_devices) for c in onnx.load(out).configuration] == [("tp", 8)]


def test_spec_and_stage(small: Path, tmp_path: Path, capsys):
    out = tmp_path / "out.onnx"
    code = main(
        ["annotate", str(small), "--devices", "2", "--spec", "W=1:2 @ [0,1]", "--spec", "h = 1:2 @ [0,1]",
         "--stage", "relu=1", "-o", str(out)]
    )
    assert code == 0
    assert _written(out) == {("mm", "W"): "1:2 @ [0,1]", ("mm", "h"): "1:2 @ [0,1]"}
    assert read_model_configs(onnx.load(out))["tp"]["relu"].pipeline_stage == 1
    assert "wrote" in capsys.readouterr().out


def test_invalid_annotation_is_not_written(small: Path, tmp_path: Path, capsys):
    out = tmp_path / "out.onnx"
    code = main(["annotate", str(small), "--devices", "2", "--spec", "W=5:2 @ [0,1]", "-o", str(out)])
    assert code == 1
    assert not out.exists()
    captured = capsys.readouterr()
    assert captured.out == ""  # the error goes to stderr, nothing else is printed
    first, *details = captured.err.strip().splitlines()
    assert first.startswith("onnx2jax annotate: error: 1 sharding error; first: axis-out-of-range"), first
    assert len(details) == 1 and "'W'" in details[0]


def test_unwritable_output_fails_before_anything_is_printed(small: Path, capsys):
    code = main(["annotate", str(small), "--devices", "2", "--spec", "W=1:2 @ [0,1]", "-o", "/nonexistent/dir/b.onnx"])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip() == ("onnx2jax annotate: error: -o /nonexistent/dir/b.onnx: folder /nonexistent/dir "
                                    "does not exist (onnx2jax annotate --help)")


@pytest.mark.parametrize(
    ("argv", "message", "code"),
    [
        (["--spec", "W"], "--spec expects TENSOR=TEXT", 2),
        (["--spec", "W=1:2 @ [0,1"], "--spec W: expected", 2),
        (["--spec", "W=1:2 @ [0,1]"], "pass --devices N", 2),
        (["--devices", "2", "--stage", "relu=x"], "--stage expects NODE=INT", 2),
        (["--plan", "megatron"], "--plan megatron needs --devices N", 2),
        (["--devices", "2", "--spec", "nope=1:2 @ [0,1]"], "'nope' is not a node output", 1),
    ],
)
def test_bad_arguments_exit_with_a_message(small: Path, tmp_path: Path, capsys, argv, message, code):
    assert main(["annotate", str(small), *argv, "-o", str(tmp_path / "out.onnx")]) == code
    err = capsys.readouterr().err
    assert message in err and err.startswith("onnx2jax annotate: error: ") and "Traceback" not in err


def test_gqa_groups_option(tmp_path: Path, capsys):
    out = tmp_path / "llama.onnx"
    argv = ["annotate", str(DATA / "tiny_llama.onnx"), "--plan", "megatron", "--devices", "8"]
    assert main([*argv, "--gqa", "groups", "-o", str(out)]) == 0
    assert _written(out)[("node_linear_1", "val_119")] == "1:4 @ [{0,1},{2,3},{4,5},{6,7}]"
    assert main([*argv, "-o", str(out)]) == 0
    assert ("node_linear_1", "val_119") not in _written(out)
    assert "left replicated (gqa='groups' splits it 4 ways)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name",
    [
        "tiny_llama",
        "tiny_gpt2",
        "tiny_bert",
    ],
)
def test_planned_fixture_compiles_with_one_all_reduce_per_pair(name: str, tmp_path: Path):
    """The plan's file runs on 8 devices like onnxruntime, with the planned collectives only:
    one all-reduce for the embedding and one per attention and per MLP pair."""
    import onnx2jax

    out = tmp_path / f"{name}.tp8.onnx"
    argv = ["annotate", str(DATA / f"{name}.onnx"), "--plan", "megatron", "--devices", "8", "-o", str(out)]
    assert main(argv) == 0
    compiled = onnx2jax.compile(str(out))
    inputs = dict(np.load(DATA / f"{name}.inputs.npz"))
    expected = dict(np.load(DATA / f"{name}.ort_outputs.npz"))
    outputs = compiled(**inputs)
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    for info, value in zip(onnx.load(out).graph.output, outputs):
        np.testing.assert_allclose(np.asarray(value), expected[info.name], rtol=0, atol=1e-5)
    collectives = compiled.report().collectives
    assert collectives["all-reduce"] == 5
    assert sum(collectives.values()) == 5, collectives
