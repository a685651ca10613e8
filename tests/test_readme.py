"""Every ```python block of README.md runs as written, from the repository root, against shipped files.

Each block runs in its own interpreter (a block may configure jax before it
starts), with 8 fake CPU devices asked for through the environment, in a
scratch folder that mirrors the repository root (links to its entries), so
that paths like ``tests/data/tiny_llama.onnx`` resolve and files a block
writes do not land in the checkout. Blocks are found when the suite is
collected, so a section added later is tested too.
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


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    """A folder whose entries link to the repository root's (writes stay in the folder)."""
    folder = tmp_path_factory.mktemp("readme")
    for entry in ROOT.iterdir():
        if entry.name not in (".git", ".venv"):
            (folder / entry.name).symlink_to(entry)
    return folder


@pytest.mark.parametrize(("block_id", "code"), python_blocks(README.read_text()), ids=lambda v: v if "\n" not in v else "")
def test_readme_python_block_runs(block_id, code, mirror):
    env = {
        **os.environ,
        "JAX_NUM_CPU_DEVICES": "8",
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=mirror, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"README block {block_id} failed:\n{code}\n{result.stderr[-3000:]}"
