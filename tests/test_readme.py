"""Every ```python block of README.md runs as written, from an empty temporary folder.

Each block runs in its own interpreter (a block may configure jax before it
starts), with 8 fake CPU devices asked for through the environment, in a fresh
empty folder: a block reaches the models it runs through onnx2jax's own
accessors (``onnx2jax.demo_model_path()``, ``onnx2jax.data_path(...)``), never
through a path relative to the checkout, and files it writes stay in that
folder. Blocks are found when the suite is collected, so a section added later
is tested too.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
TIMEOUT = 600


def python_blocks(text: str) -> list[tuple[str, str]]:
    """(id, code) of each ```python block: the id names the section heading and the block's line."""
    blocks = []
    heading = "top"
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-")
        if line.strip() == "```python":
            start = index + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            blocks.append((f"{heading}-line{start}", "\n".join(lines[start:end]) + "\n"))
            index = end
        index += 1
    return blocks


def test_the_readme_has_python_blocks():
    assert len(python_blocks(README.read_text())) >= 2


def test_no_block_reads_a_file_of_the_checkout():
    for block_id, code in python_blocks(README.read_text()):
        assert "tests/" not in code, f"{block_id} reads a file of the checkout"


@pytest.mark.parametrize(("block_id", "code"), python_blocks(README.read_text()), ids=lambda v: v if "\n" not in v else "")
def test_readme_python_block_runs(block_id, code, tmp_path):
    env = {
        **os.environ,
        "JAX_NUM_CPU_DEVICES": "8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"README block {block_id} failed:\n{code}\n{result.stderr[-3000:]}"
