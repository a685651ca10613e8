"""`import onnx2jax`, ``onnx2jax --help`` and ``onnx2jax check`` import no jax (issue 19: a lazy package).

Each check runs in a fresh interpreter: the test process itself has jax loaded already.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import onnx2jax

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "onnx2jax" / "data" / "tiny_llama.onnx"

# Runs the CLI in-process, then says whether jax was imported; argv comes from sys.argv.
CLI = """
import sys
from onnx2jax.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:  # --help
    code = e.code
print("exit", code)
assert "jax" not in sys.modules, "jax was imported"
"""


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_importing_onnx2jax_does_not_import_jax():
    result = _python("-c", "import sys, onnx2jax, onnx2jax.errors; assert 'jax' not in sys.modules, 'jax was imported'")
    assert result.returncode == 0, result.stderr


def test_every_exported_name_resolves_to_what_its_module_defines():
    import importlib

    for name, module in onnx2jax._EXPORTS.items():
        assert getattr(onnx2jax, name) is getattr(importlib.import_module(module), name)
    assert set(onnx2jax.__all__) == set(onnx2jax._EXPORTS) | {"__version__"}
    with pytest.raises(AttributeError):
        onnx2jax.no_such_name  # noqa: B018


def test_a_loaded_submodule_does_not_hide_the_export_of_its_name():
    # onnx2jax/translate.py defines translate(): once the module loads, onnx2jax.translate stays the function.
    code = "import onnx2jax, onnx2jax.translate; assert callable(onnx2jax.translate), onnx2jax.translate"
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr


def test_the_errors_the_compile_docstring_promises_are_importable_from_onnx2jax():
    from sharding.diagnostics import ShardingError
    from sharding.mesh.layout import MeshMappingError
    from sharding.text import SpecSyntaxError

    assert onnx2jax.ShardingError is ShardingError
    assert onnx2jax.MeshMappingError is MeshMappingError
    assert onnx2jax.SpecSyntaxError is SpecSyntaxError


def test_help_does_not_import_jax():
    result = _python("-c", CLI, "--help")
    assert result.returncode == 0, result.stderr
    assert "exit 0" in result.stdout and "commands:" in result.stdout


@pytest.mark.parametrize("command", ["check", "explain"])
def test_check_of_the_demo_model_does_not_import_jax(command):
    # The demo model has no annotations: check says so (exit 1) without starting jax.
    result = _python("-c", CLI, command, str(DEMO))
    assert result.returncode == 0, result.stderr
    assert "exit 1" in result.stdout and "no sharding annotations" in result.stderr


def test_annotate_then_check_the_demo_model_does_not_import_jax(tmp_path):
    annotated = tmp_path / "tp2.onnx"
    result = _python("-c", CLI, "annotate", str(DEMO), "--plan", "megatron", "--devices", "2", "-o", str(annotated))
    assert result.returncode == 0, result.stderr
    assert "exit 0" in result.stdout
    result = _python("-c", CLI, "check", str(annotated))
    assert result.returncode == 0, result.stderr
    assert "exit 0" in result.stdout and "no errors" in result.stdout


def test_the_check_command_as_a_process_does_not_import_jax():
    # The onnx2jax script's entry point in a process where any import of jax fails.
    blocker = "import sys; sys.modules['jax'] = None; from onnx2jax.cli import main; sys.exit(main())"
    result = _python("-c", blocker, "check", str(DEMO))
    assert result.returncode == 1, result.stderr
    assert "no sharding annotations" in result.stderr, result.stderr


def test_a_sharding_submodule_imports_no_other_part_of_the_package():
    # the runtime's first-token path reads sharding.shapes and onnx2jax.errors (which reads sharding.auto.errors):
    # neither loads the checker, the automatic planner's search, the Megatron plan nor the inference
    others = ("sharding.check", "sharding.auto.search", "sharding.megatron.plan", "sharding.infer", "sharding.validate")
    code = (f"import sys, sharding.shapes, onnx2jax.errors; loaded = [m for m in {others!r} if m in sys.modules]; "
            "assert not loaded, loaded")
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr
    # the generation runtime's imports: the Megatron planner only once a tensor-parallel load writes a plan
    code = ("import sys, onnx2jax.runtime.load, onnx2jax.runtime.generate; "
            "assert 'sharding.megatron.plan' not in sys.modules, 'the Megatron plan was imported'")
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr


def _type_checking_imports(package) -> dict[str, str]:
    """name -> module of the ``if TYPE_CHECKING:`` imports of a package's ``__init__`` (read with ast)."""
    import ast

    tree = ast.parse(Path(package.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
    return {alias.asname or alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_the_sharding_packages_export_what_their_modules_define():
    import importlib

    import sharding
    import sharding.auto
    import sharding.megatron

    for package in (sharding, sharding.auto, sharding.megatron):
        assert _type_checking_imports(package) == package._EXPORTS, package  # the table and what type checkers see
        for name, module in package._EXPORTS.items():
            assert getattr(package, name) is getattr(importlib.import_module(module), name), (package, name)
        assert set(package.__all__) == set(package._EXPORTS) <= set(dir(package))
    # a loaded submodule of the same name does not hide the export: sharding.infer is the front
    assert importlib.import_module("sharding.infer") is not sharding.infer
    assert sharding.infer is importlib.import_module("sharding.stage_infer").infer
    assert sharding.check is importlib.import_module("sharding.check").check
    with pytest.raises(AttributeError):
        sharding.no_such_name  # noqa: B018


def test_a_one_device_generation_imports_neither_pallas_nor_the_megatron_planner():
    # jax.extend loads Pallas (~25-65 ms of a first token); only a sharded trace's stacks ask for its trace
    # state. The Megatron planner only writes a tensor-parallel plan.
    code = (
        "import sys, onnx2jax\n"
        f"model = onnx2jax.load({str(ROOT / 'onnx2jax' / 'data' / 'llama_gqa')!r})\n"
        "tokens = list(onnx2jax.Generator(model, [1, 5, 9], max_new_tokens=2))\n"
        "assert len(tokens) == 2, tokens\n"
        "loaded = [m for m in ('jax.extend', 'sharding.megatron') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr
