"""The CLI's persistent compilation cache: on by default, ``--cache DIR``, ``--no-cache``.

Runs go in subprocesses: the cache is a process-wide jax setting that must not
leak into the other tests.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from onnx2jax.runtime import compilation_cache
from onnx2jax.cli.app import build_parser, main
from onnx2jax.cli.options import apply_cache_arguments

ROOT = pathlib.Path(__file__).parents[2]
MODEL = str(ROOT / "tests" / "data" / "tiny_gpt2.onnx")


def _cli(args: list[str], home: pathlib.Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop(compilation_cache.ENVIRONMENT)  # conftest's temporary folder: here the default folder is tested
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)


def test_run_caches_in_cache_dir_or_by_default_in_the_user_cache_dir(tmp_path):
    home = tmp_path / "xdg"
    result = _cli(["run", MODEL, "--cache", str(tmp_path / "c")], home)
    assert result.returncode == 0, result.stderr
    assert any(name.startswith("jit_") for name in os.listdir(tmp_path / "c"))
    assert "(trace + compile + run)" in result.stdout
    assert not home.exists()
    again = _cli(["run", MODEL, "--cache", str(tmp_path / "c")], home)
    assert again.returncode == 0, again.stderr
    assert "(trace + executable from cache + run)" in again.stdout, "the timing line says where the executable came from"
    result = _cli(["run", MODEL], home)
    assert result.returncode == 0, result.stderr
    assert any(name.startswith("jit_") for name in os.listdir(home / "onnx2jax" / "xla"))


def test_no_cache_leaves_jax_alone(monkeypatch):
    def refuse(path=None):
        raise AssertionError("--no-cache turned the cache on")

    monkeypatch.setattr(compilation_cache, "enable", refuse)
    for argv in (["run", MODEL, "--no-cache"], ["conformance"]):  # conformance has no cache options
        apply_cache_arguments(build_parser().parse_args(argv))


def test_a_cache_dir_that_cannot_be_made_is_one_line_and_exit_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["run", MODEL, "--cache", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--cache" in err[0] and "cannot create the folder" in err[0]


def test_default_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv(compilation_cache.ENVIRONMENT)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compilation_cache.default_dir() == str(tmp_path / "onnx2jax" / "xla")


def test_onnx2jax_cache_dir_comes_first(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(compilation_cache.ENVIRONMENT, str(tmp_path / "mine"))
    assert compilation_cache.default_dir() == str(tmp_path / "mine")


def test_tests_keep_the_cli_cache_in_a_temporary_folder(tmp_path):
    """A CLI run in the test process writes its executables under the temporary folder, none in the user's cache."""
    import tempfile

    import jax

    folder = compilation_cache.default_dir()
    assert folder.startswith(tempfile.gettempdir()) and not folder.startswith(os.path.expanduser("~/.cache"))
    before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    assert main(["run", MODEL]) == 0
    assert jax.config.jax_compilation_cache_dir == folder
    assert set(os.listdir(folder)) - before, "the run cached nothing where the tests keep the cache"


def test_the_cache_is_off_again_in_the_next_test():
    """conftest turns the process-wide cache off after the test above, so later tests write nothing."""
    import jax

    assert jax.config.jax_compilation_cache_dir is None
