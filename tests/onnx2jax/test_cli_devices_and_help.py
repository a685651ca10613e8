"""The command line as a new user meets it (issue 40): fake devices made the same way by every command that
takes ``--devices``, help examples that run outside the checkout, and a missing model folder named.

References: the notes `onnx2jax annotate --auto` prints when it could not compile its winner (``JAX sees 1
devices, not 8``) and libtpu's start-up warnings (``TPU``), both absent when the devices are made; the files
of the package on disk for the help's ``data:`` names; the file system for the missing folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from onnx2jax import bundled
from onnx2jax.cli.app import build_parser, main
from onnx2jax.platforms import accelerator_visible

ROOT = Path(__file__).resolve().parents[2]


def _user_env() -> dict[str, str]:
    """This process's environment as a user's shell has it: no JAX_PLATFORMS (the tests set cpu), no device count."""
    drop = ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "ONNX2JAX_DEBUG")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


needs_no_accelerator = pytest.mark.skipif(
    accelerator_visible(), reason="this machine shows a TPU or GPU: the CLI rightly leaves JAX on it"
)


@needs_no_accelerator
def test_annotate_auto_makes_its_devices_as_run_does(tmp_path):
    """The issue's ``annotate --auto --devices 8``: the winner is compiled on 8 fake devices and checked."""
    out = tmp_path / "auto.onnx"
    code = "import sys; from onnx2jax.cli.app import main; sys.exit(main())"
    argv = ["annotate", "data:tiny_llama", "--auto", "--devices", "8", "--batch", "2", "--seq", "16", "-o", str(out)]
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True,
                          env=_user_env(), timeout=600)
    assert done.returncode == 0, done.stderr
    printed = done.stdout + done.stderr
    assert "JAX sees" not in printed and "not compiled" not in printed, printed
    assert "winner measured (compiled HLO)" in printed and "calibrated on cpu (cpu, 8 devices)" in printed, printed
    assert "TPU" not in done.stderr, done.stderr  # JAX's platform set to cpu: libtpu never asked to open a TPU
    configs = {c.name: c.num_devices for c in onnx.load(out).configuration}
    assert configs == {"auto": 8}


def _help(command: str) -> str:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command].format_help()


def test_help_examples_use_shipped_models_one_per_line():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        text = parser.format_help()
        examples = [line for line in text.splitlines() if line.startswith("    onnx2jax ")]
        assert not [line for line in examples if re.search(r"(?<![\w.])tests/", line)], f"{name}: a path of the checkout"
        for data_name in re.findall(r"data:([\w./-]+)", text):
            if data_name != "NAME":
                assert Path(bundled.resolve(f"data:{data_name}")).exists(), (name, data_name)
    for command in ("generate", "serve"):
        lines = _help(command).splitlines()
        examples = [line for line in lines if line.startswith(f"    onnx2jax {command} ")]
        assert len(examples) >= 2, lines  # each example on a line of its own, not run into a paragraph
        assert any(f"onnx2jax {command} data:llama_gqa " in line for line in examples), examples


def test_serve_names_a_missing_folder_and_a_file(tmp_path, capsys):
    missing = tmp_path / "no_such_folder"
    assert main(["serve", str(missing)]) == 1
    assert capsys.readouterr().err.strip() == f"onnx2jax serve: error: {missing}: no such folder"
    model = tmp_path / "model.onnx"
    model.write_bytes(b"")
    assert main(["serve", str(model)]) == 1
    assert "serve takes a model folder (with tokenizer.json), not a file" in capsys.readouterr().err


def test_install_hints_name_no_package_index_entry():
    """onnx2jax is on no package index: an extra is installed from a clone, or its packages by name."""
    assert "'onnx2jax[" not in _help("serve") + _help("explain") + _help("bench")
    assert "pip install -e '.[serve]'" in _help("serve")
