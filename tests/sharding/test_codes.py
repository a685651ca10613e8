"""The diagnostic codes registry (sharding.codes) against its emitters and its docs tables."""

import ast
import importlib
import pathlib
import re

import pytest

from sharding import codes
from sharding.codes import CODES
from sharding.diagnostics import Diagnostic

ROOT = pathlib.Path(__file__).resolve().parents[2]

# String literals equal to a code that are not codes where they stand:
NOT_CODES = {
    ("sharding/tile_map.py", "collective"),  # a collective's kind, the fallback label of a `collective` note
    ("onnx2jax/cli/explain.py", "reshard"),  # a column of the `explain` table and a key of its JSON rows
}


def _table(module: str) -> dict[str, str]:
    """The code -> severity rows of the table in ``module``'s docstring."""
    doc = importlib.import_module(module).__doc__
    rows = re.findall(r"^([a-z][a-z0-9-]*)\s+(error|warning|note)\s", doc, flags=re.MULTILINE)
    return dict(rows)


@pytest.mark.parametrize("module", ["sharding.validate", "sharding.infer"])
def test_docs_table_lists_exactly_the_codes_registered_for_it(module):
    table = _table(module)
    registered = {name: info.severity for name, info in CODES.items() if info.documented_in == module}
    assert {n: table.get(n) for n in registered} == registered, "registered, absent from the table (or severity)"
    unregistered = sorted(set(table) - set(CODES))
    assert not unregistered, f"{module}'s table lists codes nobody registered: {unregistered}"
    for name in set(table) - set(registered):  # listed in both tables: emitted by both modules
        assert table[name] == CODES[name].severity


def test_every_registered_code_is_a_constant_named_after_it():
    for name in CODES:
        assert getattr(codes, name.upper().replace("-", "_")) == name


def test_an_unregistered_code_is_refused():
    with pytest.raises(ValueError, match="registered in sharding.codes"):
        Diagnostic(code="unknown-shape", severity="error", message="")


def _docstrings(tree: ast.AST) -> set[int]:
    kinds = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds) and node.body and isinstance(node.body[0], ast.Expr)
    }


def test_emitters_name_codes_through_the_registry():
    literals = []
    for package in ("sharding", "onnx2jax"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "sharding/codes.py":
                continue
            tree = ast.parse(path.read_text())
            docs = _docstrings(tree)
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and node.value in CODES and id(node) not in docs
                        and (relative, node.value) not in NOT_CODES):
                    literals.append(f"{relative}:{node.lineno}: {node.value!r}")
    assert not literals, "use sharding.codes' constants:\n" + "\n".join(literals)
