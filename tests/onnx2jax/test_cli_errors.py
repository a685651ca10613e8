"""What a new user's mistakes give on the command line: one line naming the problem and what to do.

Exit status 1 for a user error, 2 for a usage error; never a traceback unless
``--debug``. And nothing reports success when it did nothing.
"""

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh
import pytest

from onnx2jax.cli.app import main
from onnx2jax.cli.errors import CliError

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


def _one_line_error(capsys, command: str) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "Traceback" not in err + captured.out
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"onnx2jax {command}: error: "), err
    return err


@pytest.fixture(scope="module")
def embedding(tmp_path_factory) -> Path:
    """ids [batch, 3] (int64) -> Gather from a 4-row table -> MatMul: ids >= 4 are invalid."""
    graph = oh.make_graph(
        [
            oh.make_node("Gather", ["table", "ids"], ["h"], name="embed"),
            oh.make_node("MatMul", ["h", "W"], ["y"], name="mm"),
        ],
        "embedding",
        [oh.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch", 3])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3, 2])],
        [
            onh.from_array(np.arange(20, dtype=np.float32).reshape(4, 5), "table"),
            onh.from_array(np.ones((5, 2), np.float32), "W"),
        ],
    )
    path = tmp_path_factory.mktemp("models") / "embedding.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), path)
    return path


@pytest.fixture(scope="module")
def not_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("junk") / "notes.onnx"
    path.write_text("this is not a model\n")
    return path


# --- 1. one line, exit 1 (user error) or 2 (usage error), no traceback ---

@pytest.mark.parametrize("command", [["run"], ["check"], ["explain"], ["annotate", "--plan", "megatron", "--devices", "2", "-o", "x.onnx"]])
def test_missing_model_file(command, capsys):
    assert main([command[0], "nosuch.onnx", *command[1:]]) == 1
    assert "nosuch.onnx" in _one_line_error(capsys, command[0])


@pytest.mark.parametrize("command", ["run", "check", "annotate"])
def test_file_that_is_not_onnx(command, not_onnx, tmp_path, capsys):
    extra = ["--devices", "2", "--spec", "x=0:2 @ [0,1]", "-o", str(tmp_path / "o.onnx")] if command == "annotate" else []
    assert main([command, str(not_onnx), *extra]) == 1
    assert "not a valid ONNX model" in _one_line_error(capsys, command)


def test_run_wrong_input_name(embedding, tmp_path, capsys):
    np.save(tmp_path / "ids.npy", np.zeros((2, 3), np.int64))
    assert main(["run", str(embedding), "--input", f"tokens={tmp_path / 'ids.npy'}"]) == 2
    assert "no input 'tokens'; its inputs: ids" in _one_line_error(capsys, "run")


def test_run_missing_npy(embedding, capsys):
    assert main(["run", str(embedding), "--input", "ids=nosuch.npy"]) == 1
    assert "no such file: nosuch.npy" in _one_line_error(capsys, "run")


def test_run_output_folder_missing(embedding, capsys):
    assert main(["run", str(embedding), "--output", "nosuch/out.npz"]) == 2
    assert "does not exist" in _one_line_error(capsys, "run")


def test_too_few_devices(annotated, capsys):
    import jax

    assert len(jax.devices()) == 8  # jax has started with 8 CPU devices: 16 cannot be had
    assert main(["run", str(annotated), "--devices", "16"]) == 1
    assert "16 devices needed, JAX has 8" in _one_line_error(capsys, "run")


def test_unsupported_op(tmp_path, capsys):
    graph = oh.make_graph(
        [oh.make_node("Frobnicate", ["x"], ["y"], domain="com.example", name="frob")],
        "custom",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    path = tmp_path / "custom.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.example", 1)]), path)
    assert main(["run", str(path)]) == 1
    assert "com.example::Frobnicate" in _one_line_error(capsys, "run")


def test_debug_shows_the_traceback(embedding):
    with pytest.raises(CliError):
        main(["run", str(embedding), "--input", "ids=nosuch.npy", "--debug"])
    with pytest.raises(CliError):
        main(["--debug", "run", str(embedding), "--input", "ids=nosuch.npy"])


def test_debug_environment_variable(embedding, monkeypatch):
    monkeypatch.setenv("ONNX2JAX_DEBUG", "1")
    with pytest.raises(CliError):
        main(["run", str(embedding), "--input", "ids=nosuch.npy"])


# --- 2. nothing reports success when nothing happened ---

def test_demo_on_a_device_count_that_divides_no_layer_still_splits_the_vocabulary(capsys):
    """3 devices divide no head or width of tiny Llama, but its vocabulary splits unevenly (issue 21): the
    plan shards something, and the sharded run equals the unsharded one. (A plan that shards nothing is
    refused: test_annotate_plan_that_writes_nothing.) The logits come back replicated, which the command says
    as its own one-line note: no Python source line, no ``UserWarning:``."""
    assert main(["demo", "--devices", "3", "--verbose", "--no-cache"]) == 0
    printed = capsys.readouterr()
    assert "0:3 @ [0..2]" in printed.out and "max |sharded - unsharded| = 0 OK" in printed.out
    assert "Warning:" not in printed.err and ".py:" not in printed.err, printed.err
    (note,) = printed.err.strip().splitlines()
    assert note.startswith("onnx2jax demo: note: output 'logits' [2, 16, 256]: ")
    assert note.endswith("so it comes back replicated")


def test_annotate_plan_that_writes_nothing(tmp_path, capsys):
    graph = oh.make_graph(  # one Conv, no row partner: nothing the Megatron plan splits
        [oh.make_node("Conv", ["x", "w"], ["c"], name="conv"), oh.make_node("Relu", ["c"], ["y"], name="relu")],
        "cnn",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 6, 6])],
        [onh.from_array(np.ones((4, 3, 3, 3), np.float32), "w")],
    )
    cnn = tmp_path / "cnn.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)]), cnn)
    out = tmp_path / "out.onnx"
    assert main(["annotate", str(cnn), "--plan", "megatron", "--devices", "2", "-o", str(out)]) == 1
    assert "shards nothing" in _one_line_error(capsys, "annotate")
    assert not out.exists()


@pytest.mark.parametrize("command", ["check", "explain"])
def test_check_an_unannotated_model(command, embedding, capsys):
    assert main([command, str(embedding)]) == 1
    assert "has no sharding annotations" in _one_line_error(capsys, command)


def test_run_devices_on_an_unannotated_model(embedding, capsys):
    assert main(["run", str(embedding), "--devices", "8"]) == 1
    assert "has no sharding annotations, so --devices 8 has nothing to shard" in _one_line_error(capsys, "run")


def test_dim_typo(embedding, capsys):
    assert main(["run", str(embedding), "--dim", "btch=4"]) == 2
    assert "no symbolic dim 'btch' (its symbolic dims: batch)" in _one_line_error(capsys, "run")


@pytest.fixture(scope="module")
def annotated(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("annotated") / "llama_tp2.onnx"
    assert main(["annotate", str(DATA / "tiny_llama.onnx"), "--plan", "megatron", "--devices", "2", "-o", str(path)]) == 0
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--input-shape", "nosuch=2,16"], "--input-shape nosuch: the model has no input 'nosuch'"),
        (["explain", "--node", "nosuch"], "--node nosuch: no node of that name"),
        (["explain", "--tensor", "nosuch"], "--tensor nosuch: no tensor of that name"),
    ],
)
def test_names_that_do_not_exist(annotated, capsys, argv, message):
    capsys.readouterr()
    assert main([argv[0], str(annotated), *argv[1:]]) == 2
    assert message in _one_line_error(capsys, argv[0])


def test_conformance_unknown_op(capsys):
    assert main(["conformance", "--op", "Nonexistent"]) == 2
    assert "--op Nonexistent: no node case tests that op type" in _one_line_error(capsys, "conformance")


def test_conformance_op_is_exact_and_known_failures_exit_0(capsys):
    # Bernoulli's cases (3, and 3 *_expanded) fail as listed in node_xfails.yaml (random draws): known, so exit 0.
    assert main(["conformance", "--op", "Bernoulli"]) == 0
    out = capsys.readouterr().out
    assert "6 known failures (node_xfails.yaml), 0 unexpected" in out
    assert main(["conformance", "--op", "Relu"]) == 0
    assert capsys.readouterr().out.startswith("2/2 node cases pass")


# --- 5. run: inputs, outputs, timings ---

def test_random_ids_stay_inside_the_embedding(embedding, tmp_path, capsys):
    out = tmp_path / "out.npz"
    assert main(["run", str(embedding), "--dim", "batch=64", "--output", str(out), "--check"]) == 0
    printed = capsys.readouterr().out
    assert "random integers in [0, 4), the rows of 'table'" in printed
    assert "first call" in printed and "per call (mean of" in printed
    y = np.load(out)["y"]
    assert y.shape == (64, 3, 2)
    # independent reference: numpy on the drawn ids is not available, but every row sum is a table row's sum
    assert set(np.unique(y[..., 0])) <= {float(r.sum()) for r in np.arange(20, dtype=np.float32).reshape(4, 5)}


def test_symbolic_dim_default_is_said(embedding, capsys):
    assert main(["run", str(embedding)]) == 0
    assert "symbolic dim 'batch' = 2 (set it with --dim batch=N)" in capsys.readouterr().out


def test_export_says_a_dim_kept_symbolic_is_kept_not_drawn(embedding, tmp_path, capsys):
    """``--dim batch=symbolic``: no 'batch = 2' note; the input stands for its shape; the artifact takes any batch."""
    from onnx2jax.export import load

    artifact = tmp_path / "embedding.jaxexport"
    capsys.readouterr()
    assert main(["export", str(embedding), "-o", str(artifact), "--dim", "batch=symbolic"]) == 0
    out = capsys.readouterr().out
    assert "symbolic dim 'batch' = " not in out and "random integers" not in out, out
    assert "note: input 'ids' int64 (batch, 3): its shape and dtype only, no values drawn ('batch' kept symbolic)" in out
    assert "note: symbolic dim 'batch' kept symbolic: the artifact takes every size of it" in out
    assert "ids [batch, 3]" in out
    table = np.arange(20, dtype=np.float32).reshape(4, 5)
    for batch in (1, 5):
        ids = np.arange(batch * 3, dtype=np.int64).reshape(batch, 3) % 4
        (y,) = load(artifact)(ids)
        np.testing.assert_allclose(np.asarray(y), table[ids] @ np.ones((5, 2), np.float32))


def test_export_with_a_sized_dim_draws_it_and_refuses_both(embedding, tmp_path, capsys):
    artifact = tmp_path / "embedding.jaxexport"
    capsys.readouterr()
    assert main(["export", str(embedding), "-o", str(artifact), "--dim", "batch=4"]) == 0
    out = capsys.readouterr().out
    assert "note: input 'ids' int64 (4, 3): random integers in [0, 4)" in out and "kept symbolic" not in out, out
    assert "ids [4, 3]" in out
    assert main(["export", str(embedding), "-o", str(artifact), "--dim", "batch=4", "--dim", "batch=symbolic"]) == 2
    assert "--dim batch: both batch=4 and batch=symbolic" in _one_line_error(capsys, "export")


def test_int32_input_is_converted_with_a_note(embedding, tmp_path, capsys):
    ids = np.array([[0, 1, 2], [3, 2, 1]], np.int32)
    np.save(tmp_path / "ids.npy", ids)
    out = tmp_path / "out.npz"
    assert main(["run", str(embedding), "--input", f"ids={tmp_path / 'ids.npy'}", "--output", str(out)]) == 0
    assert "input 'ids': converted int32 -> int64" in capsys.readouterr().out
    table = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_allclose(np.load(out)["y"], table[ids] @ np.ones((5, 2), np.float32))


def test_fixture_npz_inputs_are_accepted(tmp_path, capsys):
    out = tmp_path / "out.npz"
    argv = ["run", str(DATA / "tiny_llama.onnx"), "--input", str(DATA / "tiny_llama.inputs.npz"), "--output", str(out)]
    assert main(argv) == 0
    expected = np.load(DATA / "tiny_llama.ort_outputs.npz")["logits"]
    np.testing.assert_allclose(np.load(out)["logits"], expected, atol=1e-4)


def test_check_prints_our_outputs_when_onnxruntime_cannot_run(tmp_path, capsys, monkeypatch):
    # A model with a local function: we inline and run it; onnxruntime is made to refuse it (an
    # ir_version from the future, which used to do that, is now refused by onnx2jax too).
    import onnxruntime

    def refuse(*args, **kwargs):
        raise RuntimeError("this onnxruntime cannot load the model")

    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)
    fn = oh.make_function("my.fns", "Twice", ["x"], ["y"], [oh.make_node("Add", ["x", "x"], ["y"])],
                          [oh.make_opsetid("", 18)])
    graph = oh.make_graph(
        [oh.make_node("Twice", ["x"], ["y"], domain="my.fns", name="twice")], "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = oh.make_model(graph, functions=[fn], opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("my.fns", 1)])
    path = tmp_path / "twice.onnx"
    onnx.save(model, path)
    assert main(["run", str(path), "--check"]) == 1
    captured = capsys.readouterr()
    assert "y: shape (2,) dtype float32" in captured.out
    assert captured.err.startswith("onnx2jax run: error: not checked: onnxruntime cannot run this model")


# --- 6. conventions ---

def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == "onnx2jax 0.1.0"


def test_every_option_has_help():
    from onnx2jax.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert all(name in parser.description for name in sub.choices)
    for name, child in sub.choices.items():
        assert "``" not in (child.description or "") + (child.format_help()), name  # no raw reStructuredText
        for action in child._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"


def test_piped_output_that_stops_early_is_quiet():
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    reader = subprocess.Popen(
        [sys.executable, "-c", code, "annotate", "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    reader.stdout.close()  # the reader of `| head` went away before anything was written
    err = reader.stderr.read().decode()
    reader.wait(timeout=120)
    assert "BrokenPipeError" not in err and "Traceback" not in err, err


def test_piped_tables_are_whole_lines(annotated, capsys):
    # Not a terminal (pytest captures): no cell is cut with an ellipsis or folded over lines.
    assert main(["explain", str(annotated), "--node", "node_linear_6"]) == 0
    out = capsys.readouterr().out
    assert "…" not in out and "\x1b[" not in out
    assert any("node_linear_6" in line and "MatMul" in line and "mul_390" in line for line in out.splitlines())


def test_terminal_tables_fit_80_columns(annotated, monkeypatch):
    from rich.console import Console

    import onnx2jax.cli.console

    console = Console(width=80, force_terminal=True, record=True)
    spinner = Console(width=80, force_terminal=True, file=io.StringIO())  # stderr's: its frames are transient
    monkeypatch.setattr(onnx2jax.cli.console, "make_console", lambda stderr=False: spinner if stderr else console)
    assert main(["explain", str(annotated), "--node", "node_linear_6"]) == 0
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "mul_390" in text


def test_invalid_annotations_are_listed_without_a_traceback(tmp_path, capsys):
    from sharding.annotate import add_configuration, annotate_tensor
    from sharding.text import parse_spec

    graph = oh.make_graph(  # x is cut on K (axis 1), W is not: no device holds matching K blocks
        [oh.make_node("MatMul", ["x", "W"], ["y"], name="mm")],
        "bad",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 6])],
        [onh.from_array(np.ones((4, 6), np.float32), "W")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    add_configuration(model, "tp", 2)
    annotate_tensor(model, "x", parse_spec("1:2 @ [0,1]", "x"), "tp")
    annotate_tensor(model, "W", parse_spec("1:2 @ [0,1]", "W"), "tp")
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    assert main(["run", str(path), "--devices", "2"]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    first, *problems = captured.err.strip().splitlines()
    assert first.startswith("onnx2jax run: error: ") and "sharding error" in first
    assert any("node 'mm' (MatMul)" in line for line in problems)


def _notes_only(capsys, command: str) -> list[str]:
    """stderr's lines, each the command's own note: no Python source line, no warning category."""
    err = capsys.readouterr().err
    assert "Warning:" not in err and ".py:" not in err, err
    lines = err.strip().splitlines()
    assert lines and all(line.startswith(f"onnx2jax {command}: note: ") for line in lines), err
    return lines


def test_generate_without_a_cache_notes_the_quadratic_recompute(capsys):
    assert main(["generate", "data:tiny_llama", "--prompt-ids", "1,2,3", "--max-new-tokens", "1"]) == 0
    (note,) = _notes_only(capsys, "generate")
    assert "no KV cache inputs" in note


def test_in_python_a_warning_stays_a_warning():
    import warnings

    from onnx2jax.cli.errors import run_guarded

    shown = warnings.showwarning
    assert run_guarded("demo", lambda: warnings.warn("inside", stacklevel=1) or 0) == 0
    assert warnings.showwarning is shown
    with pytest.warns(UserWarning, match="outside"):
        warnings.warn("outside", stacklevel=1)


def test_export_refuses_a_symbolic_dim_nobody_sized_naming_it(tmp_path, capsys):
    """No silent 2: the artifact would take that size only. Either size (--dim seq=N) or keep it (=symbolic)."""
    artifact = tmp_path / "x.jaxexport"
    assert main(["export", "data:tiny_llama", "-o", str(artifact), "--dim", "batch=2"]) == 2
    err = _one_line_error(capsys, "export")
    assert "symbolic dim 'seq' of the model has no size: give --dim seq=N" in err and "--dim seq=symbolic" in err
    assert "'batch'" not in err and not artifact.exists()


def test_run_that_fails_on_dims_nobody_sized_says_which_to_give(capsys):
    """A genai decoder at 2 for each of its symbolic dims fails inside GroupQueryAttention: the error says
    which dims took 2 and how to size them."""
    assert main(["run", "data:llama_gqa/model.onnx", "--no-cache"]) == 1
    err = _one_line_error(capsys, "run")
    assert "GroupQueryAttention" in err
    assert err.endswith("give the sizes the model expects (--dim batch_size=N --dim sequence_length=N "
                        "--dim total_sequence_length=N --dim past_sequence_length=N --dim kv_cache_dim=N)")


def test_xla_own_warnings_stay_off_stderr_unless_debug(tmp_path):
    """XLA's C++ log ("Involuntary full rematerialization", lines of HLO) is not a one-line note: the command
    line keeps it off stderr (TF_CPP_MIN_LOG_LEVEL=2 before JAX starts); --debug lets it through. The model:
    [36] cut in 4 reshaped to [6, 6] cut in 4 on axis 1, which does not divide (XLA warns at its compile)."""
    from sharding.annotate import add_configuration, set_spec
    from sharding.text import parse_spec

    graph = oh.make_graph(
        [oh.make_node("Reshape", ["x", "shape"], ["y"], name="r")], "remat",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [36])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [6, 6])],
        [onh.from_array(np.array([6, 6], np.int64), "shape")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    add_configuration(model, "tp", 8)
    groups = "[{0,1},{2,3},{4,5},{6,7}]"
    set_spec(model, "r", parse_spec(f"0:4 @ {groups}", "x"), "tp")
    set_spec(model, "r", parse_spec(f"1:4 @ {groups}", "y"), "tp")
    path = tmp_path / "remat.onnx"
    onnx.save(model, path)
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "ONNX2JAX_DEBUG")}
    env.update(JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))

    def run(*extra: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, "run", str(path), "--devices", "8", "--no-cache", *extra],
                              cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stderr

    quiet = run()
    assert "rematerialization" not in quiet and ".cc:" not in quiet, quiet
    assert all(line.startswith(("note: ", "onnx2jax run: note: ")) for line in quiet.strip().splitlines()), quiet
    assert "Involuntary full rematerialization" in run("--debug")  # the model does make XLA warn
