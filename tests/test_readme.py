"""Every ```python block and every command of README.md and the guides in docs/ runs as written, from an empty
temporary folder outside the checkout.

What runs:

- Each ```python block runs in its own interpreter with plain ``python``, as a user runs it, in a fresh
  empty folder: no ``JAX_NUM_CPU_DEVICES`` (nor ``XLA_FLAGS``) is set for it, so a block that needs several
  devices makes its fake CPU devices itself (``jax.config.update("jax_num_cpu_devices", 8)`` before jax
  starts). ``JAX_PLATFORMS=cpu`` stays set (tests/conftest.py: this machine has libtpu but no TPU). A block
  whose fence has ``<!-- continues the block above -->`` on the line above it runs after the runnable block
  before it in the same file (and that block's own predecessors), in one interpreter: the chain runs once,
  its first block not again alone. A block reaches the models
  it runs through onnx2jax's own accessors (``onnx2jax.demo_model_path()``, ``onnx2jax.data_path(...)``),
  never through a path of the checkout, and the files it writes stay in that folder. A block that appears
  word for word in several files (a README quickstart that is also its guide's first example) runs once.
- Each ```bash or ```sh block runs line by line (``\\`` continuations joined, ``# comments`` dropped) in
  one fresh empty folder per block, in this process: a line ``onnx2jax ...`` through the CLI's ``main``
  (exit status 0 expected, or N where the line's comment says ``exit status N``), with the shipped models named ``data:NAME`` (``onnx2jax data``). An
  install line (``pip install ...``) is what CI did before the suite and ``python -m pytest ...`` is the
  suite itself: both are skipped; any other line is an error, so that nothing is silently left untested.
- A fenced block whose info string names a file (```yaml file=shard.yaml) is written into the folder of
  every command block of the same file before it runs.

The convention for a block that cannot run here: the line right above its fence is
``<!-- not run: REASON -->``, REASON saying what it needs (GPUs, a TPU, several hosts, a checkout of the
repository, minutes of benchmarking). Such blocks are listed by ``test_blocks_not_run_say_why`` and
nowhere run. Blocks are found when the suite is collected, so a section or guide added later is tested
too.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT = 600
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->")
CONTINUES = "<!-- continues the block above -->"


def fenced_blocks(text: str) -> list[dict]:
    """Every fenced block: its info string, code, section heading, first line and not-run reason (or None)."""
    blocks = []
    heading = "top"
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("#"):
            heading = re.sub(r"[^a-z0-9]+", "-", line.lstrip("#").strip().lower()).strip("-")
        if line.startswith("```"):
            info = line[3:].strip()
            start = index + 1
            end = start
            while end < len(lines) and not lines[end].startswith("```"):
                end += 1
            reason = NOT_RUN.search(lines[index - 1]) if index else None
            blocks.append({
                "info": info, "code": "\n".join(lines[start:end]) + "\n", "heading": heading, "line": start,
                "not_run": reason.group(1) if reason else None,
                "continues": bool(index) and CONTINUES in lines[index - 1],
            })
            index = end
        index += 1
    return blocks


def _blocks(kinds: tuple[str, ...], *, runnable: bool = True) -> list[tuple[str, Path, dict]]:
    found = []
    for path in DOCS:
        for block in fenced_blocks(path.read_text()):
            if block["info"].split(" ")[0] in kinds and (block["not_run"] is None) == runnable:
                found.append((f"{path.stem}-{block['heading']}-line{block['line']}", path, block))
    return found


def python_blocks() -> list[tuple[str, str]]:
    """(id, code) of each runnable ```python block, each distinct code once; a block that continues the one
    above is appended to that block's code (the chain's id is its first block's), which then runs only so."""
    chains: list[list] = []  # [id, code, path]
    for block_id, path, block in _blocks(("python",)):
        if block["continues"]:
            assert chains and chains[-1][2] == path, f"{block_id} continues no runnable python block above it"
            chains[-1][1] += "\n" + block["code"]
        else:
            chains.append([block_id, block["code"], path])
    seen, unique = set(), []
    for block_id, code, _ in chains:
        if code not in seen:
            seen.add(code)
            unique.append((block_id, code))
    return unique


def test_the_readme_and_guides_have_blocks():
    assert len([b for b in fenced_blocks(README.read_text()) if b["info"] == "python"]) >= 3
    assert len(python_blocks()) >= 10 and len(_blocks(("bash", "sh"))) >= 8


def test_a_block_that_continues_runs_after_the_one_above_and_not_alone():
    text = "```python\nfirst = 1\n```\n\n<!-- continues the block above -->\n```python\nprint(first)\n```\n"
    blocks = fenced_blocks(text)
    assert [b["continues"] for b in blocks] == [False, True]
    chains = {block_id: code for block_id, code in python_blocks()}
    guide = next(code for block_id, code in chains.items() if block_id.startswith("pipeline-training-"))
    assert "per_device_group(optax.adam" in guide and guide.index("compiled = ") < guide.index("train_step(")
    assert not any(code.startswith("from flax import nnx") for code in chains.values())  # no follow-on alone


def test_no_block_reads_a_file_of_the_checkout():
    for block_id, _, block in _blocks(("python", "bash", "sh")):
        code = block["code"]
        assert not re.search(r"(?<![\w.])tests/|(?<![\w.])examples/|(?<![\w.])bench/", code), (
            f"{block_id} reads a file of the checkout"
        )


def test_blocks_not_run_say_why():
    """Blocks that cannot run here (GPUs, several hosts, a checkout) are marked, each with its reason."""
    skipped = _blocks(("python", "bash", "sh"), runnable=False)
    for block_id, _, block in skipped:
        assert len(block["not_run"].split()) >= 3, f"{block_id}: say what it needs"
    assert len(skipped) <= 16, [b for b, _, _ in skipped]  # a few: most blocks must run


@pytest.mark.parametrize(("block_id", "code"), python_blocks(), ids=[b[0] for b in python_blocks()])
def test_python_block_runs(block_id, code, tmp_path):
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS")},
        "JAX_PLATFORMS": "cpu",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    assert result.returncode == 0, f"block {block_id} failed:\n{code}\n{result.stderr[-3000:]}"


def command_lines(code: str) -> list[tuple[list[str], int]]:
    """A shell block's commands as (argument list, expected exit status): continuations joined, comments
    dropped, ``&&`` split. A comment saying ``exit status N`` expects N (a documented refusal), else 0."""
    joined = re.sub(r"\\\n\s*", " ", code)
    commands = []
    for line in joined.splitlines():
        expected = re.search(r"#.*\bexit status (\d+)", line)
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            if words[:cut]:
                commands.append((words[:cut], int(expected.group(1)) if expected else 0))
            words = words[cut + 1:]
    return commands


def _files_of(path: Path) -> dict[str, str]:
    """The blocks of ``path`` that name a file (```yaml file=shard.yaml): name -> content."""
    files = {}
    for block in fenced_blocks(path.read_text()):
        match = re.search(r"\bfile=(\S+)", block["info"])
        if match:
            files[match.group(1)] = block["code"]
    return files


@pytest.mark.parametrize(("block_id", "path", "block"), _blocks(("bash", "sh")), ids=[b[0] for b in _blocks(("bash", "sh"))])
def test_command_block_runs(block_id, path, block, tmp_path, monkeypatch, capsys):
    from onnx2jax.cli.app import main

    monkeypatch.chdir(tmp_path)
    for name, content in _files_of(path).items():
        (tmp_path / name).write_text(content)
    for argv, expected in command_lines(block["code"]):
        if argv[:2] == ["pip", "install"] or argv[:3] == ["python", "-m", "pytest"]:
            continue  # CI installed onnx2jax before running the suite; the suite is this run
        assert argv[0] == "onnx2jax", f"{block_id}: {shlex.join(argv)} is no onnx2jax command; mark the block not run"
        status = main(argv[1:])
        printed = capsys.readouterr()
        assert status == expected, f"{block_id}: {shlex.join(argv)} exited {status}:\n{printed.err[-3000:]}"


def command_line_synopsis(text: str) -> dict[str, str]:
    """The Command line section's synopsis block, per sub-command: its lines (continuations included).

    The top-level line (``onnx2jax --version ...``) is under the key ``""``.
    """
    section = text[text.index("## Synopsis"):]
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
    synopsis = command_line_synopsis((ROOT / "docs" / "cli.md").read_text())
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


# Guides other engineers write at the same time; the README links them before they land.
PENDING_GUIDES = {"generation.md", "generation-architectures.md", "quantized.md", "auto-plans.md",
                  "pipeline-training.md", "serving.md"}


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a markdown file's headings (outside fenced blocks)."""
    anchors, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = re.sub(r"[`*]", "", line.lstrip("#").strip().lower())
            anchors.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return anchors


def test_links_between_the_readme_and_the_guides_point_at_files_and_headings():
    for path in DOCS:
        text = path.read_text()
        for target, anchor in re.findall(r"\]\(([\w./-]*?\.md|)(?:#([\w-]+))?\)", text):
            if target in PENDING_GUIDES or target.startswith("docs/") and target[5:] in PENDING_GUIDES:
                continue
            linked = path if not target else (path.parent / target)
            assert linked.is_file(), f"{path.name} links {target}, which does not exist"
            if anchor:
                assert anchor in _anchors(linked.read_text()), f"{path.name} links {target}#{anchor}: no such heading"


def test_every_guide_has_a_table_of_contents():
    for path in DOCS[1:]:
        if path.name in ("architecture.md",):
            continue  # the tree's map, read whole
        assert "**Contents**" in path.read_text(), f"{path.name} has no table of contents"
