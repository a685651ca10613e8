"""A package that imports its exported names on first use (module ``__getattr__``, PEP 562), as ``onnx2jax``'s
``__init__`` does: importing one submodule then imports no other (``sharding.shapes`` on the runtime's path
loads neither the checker nor the automatic planner). Used by ``sharding``, ``sharding.auto`` and
``sharding.megatron``, each with one table of its exports."""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Mapping


class _Package(types.ModuleType):
    """A lazy package's module type: an exported name stays the export when a submodule of that name loads.

    Importing a submodule sets it as an attribute of its package: once anything imported ``sharding.infer``
    (the module), ``sharding.infer`` would be that module rather than the function exported under that name
    (``sharding.stage_infer.infer``). The submodule is left to ``sys.modules`` (``from sharding.infer import
    ...`` finds it there) and the name to the package's ``__getattr__``, as the eager imports the package's
    ``__init__`` used to make left it."""

    def __setattr__(self, name: str, value: Any) -> None:
        exports = self.__dict__.get("_EXPORTS", {})
        if isinstance(value, types.ModuleType) and name in exports and value.__name__ == f"{self.__name__}.{name}":
            return
        super().__setattr__(name, value)


def lazy_package(name: str, exports: Mapping[str, str]) -> None:
    """Makes the package ``name`` (its ``__init__`` calling this) import each of ``exports`` (exported name ->
    the module that defines it) on first use, keep it, and list it in ``__all__`` and ``dir()``."""
    package = sys.modules[name]
    table = dict(exports)

    def __getattr__(attribute: str) -> Any:
        module = table.get(attribute)
        if module is None:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        value = getattr(importlib.import_module(module), attribute)
        package.__dict__[attribute] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(package.__dict__) | set(table))

    package.__dict__.update(_EXPORTS=table, __all__=sorted(table), __getattr__=__getattr__, __dir__=__dir__)
    package.__class__ = _Package
