"""docs/architecture.md names every module and package of the tree, so a newcomer finds each one there."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# Folders the doc describes as a whole, with the convention for adding to them.
BY_FOLDER = {("onnx2jax", "ops"), ("onnx2jax", "cli"), ("sharding", "rules"), ("sharding", "megatron")}


def _names() -> set[str]:
    """Every module stem and package folder below onnx2jax/ and sharding/, but the modules of BY_FOLDER."""
    found = set()
    for package in ("onnx2jax", "sharding"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).parts
            if path.name == "__init__.py":
                found.add(parts[-2] + "/")
            elif tuple(parts[:2]) not in BY_FOLDER:
                found.add(path.stem)
    return found


def test_every_module_is_placed_in_the_architecture_doc():
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = sorted(name for name in _names() if name.removesuffix("/") not in text)
    assert not missing, f"docs/architecture.md does not mention: {missing}"
