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


def command_line_synopsis(text: str) -> dict[str, str]:
    """The Command line section's synopsis block, per sub-command: its lines (continuations included).

    The top-level line (``onnx2jax --version ...``) is under the key ``""``.
    """
    section = text[text.index("## Command line"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    entries: dict[str, str] = {}
    current = None
    for line in block.splitlines():
        if line.startswith("onnx2jax "):
            word = line.split()[1]
            current = "" if word.startswith("-") else word
            entries[current] = line
        elif current is not None and line.startswith(" "):
            entries[current] += "\n" + line
    return entries


def _options(parser) -> set[str]:
    """Every option string of a parser but help and --debug (which every command has, said once)."""
    return {o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help", "--debug")}


def _mentioned(text: str) -> set[str]:
    """The options a synopsis text names (``--flag``, ``-o``)."""
    return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", text))


def test_the_command_line_section_names_every_command_and_option_the_parsers_have():
    import argparse

    from onnx2jax.cli.app import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    synopsis = command_line_synopsis(README.read_text())
    assert set(synopsis) == set(sub.choices) | {""}, sorted(synopsis)
    for name, child in sub.choices.items():
        text = synopsis[name]
        have = _options(child)
        # every option of the parser is in the synopsis, in its long form where it has one
        for action in child._actions:
            strings = [o for o in action.option_strings if o not in ("-h", "--help", "--debug")]
            if strings:
                assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in strings), (name, strings)
        # and the synopsis names no option the parser lacks
        stale = {o for o in _mentioned(text) if o.startswith("--") or len(o) == 2} - have
        assert not stale, (name, stale)
    top = _options(parser) | {"--help", "--debug"}
    assert _mentioned(synopsis[""]) <= top and {"--version", "--help", "--debug"} <= _mentioned(synopsis[""])
