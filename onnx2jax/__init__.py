"""onnx2jax: run ONNX models on JAX/XLA, sharded from ONNX's multi-device annotations.

The package imports lazily: ``import onnx2jax`` loads no jax and no op module, so the CLI's ``--help`` and
``check`` start fast. A name of ``__all__`` is imported from its module on first use (module ``__getattr__``,
PEP 562); `_EXPORTS` is the one table, so exporting a name is one line there.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name -> module that defines it
_EXPORTS: dict[str, str] = {
    "compile": "onnx2jax.runtime.compile",
    "Executable": "onnx2jax.runtime.executable",
    "Compiled": "onnx2jax.runtime.spmd",
    "PipelineCompiled": "onnx2jax.runtime.pipeline",
    "SegmentedCompiled": "onnx2jax.runtime.segmented",
    "translate": "onnx2jax.translate",
    "JaxModel": "onnx2jax.translate",
    "load": "onnx2jax.runtime.load",
    "Decoder": "onnx2jax.runtime.decoder",
    "generate": "onnx2jax.runtime.generate",
    "Generator": "onnx2jax.runtime.generate",
    "load_model": "onnx2jax.loading",
    "data_path": "onnx2jax.bundled",
    "demo_model_path": "onnx2jax.bundled",
    "ModelLoadError": "onnx2jax.errors",
    "NodeError": "onnx2jax.errors",
    "PrecisionError": "onnx2jax.errors",
    "UnsupportedOpError": "onnx2jax.errors",
    "DeviceCountError": "onnx2jax.errors",
    "InputError": "onnx2jax.errors",
    "InputRangeError": "onnx2jax.errors",
    "ShardingError": "onnx2jax.errors",
    "MeshMappingError": "onnx2jax.errors",
    "SpecSyntaxError": "onnx2jax.errors",
    "BackwardEdgeError": "onnx2jax.errors",
}

__all__ = sorted(_EXPORTS) + ["__version__"]


def __getattr__(name: str) -> Any:
    """Imports an exported name from its module on first use and keeps it here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnx2jax' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    """The package's module type: an exported name stays the export when its submodule loads.

    Importing a submodule sets it as an attribute of the package, so once anything imported
    ``onnx2jax.translate`` (the module), ``onnx2jax.translate`` would be that module rather than the function
    of the same name. Keeping the export instead is what the eager ``from onnx2jax.translate import
    translate`` in this file used to give.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and _EXPORTS.get(name) == value.__name__:
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports on first use
    from onnx2jax.errors import BackwardEdgeError as BackwardEdgeError
    from onnx2jax.errors import DeviceCountError as DeviceCountError
    from onnx2jax.errors import InputError as InputError
    from onnx2jax.errors import InputRangeError as InputRangeError
    from onnx2jax.errors import MeshMappingError as MeshMappingError
    from onnx2jax.errors import ModelLoadError as ModelLoadError
    from onnx2jax.errors import NodeError as NodeError
    from onnx2jax.errors import PrecisionError as PrecisionError
    from onnx2jax.errors import ShardingError as ShardingError
    from onnx2jax.errors import SpecSyntaxError as SpecSyntaxError
    from onnx2jax.errors import UnsupportedOpError as UnsupportedOpError
    from onnx2jax.bundled import data_path as data_path
    from onnx2jax.bundled import demo_model_path as demo_model_path
    from onnx2jax.loading import load_model as load_model
    from onnx2jax.runtime.pipeline import PipelineCompiled as PipelineCompiled
    from onnx2jax.runtime.segmented import SegmentedCompiled as SegmentedCompiled
    from onnx2jax.runtime.spmd import Compiled as Compiled
    from onnx2jax.runtime.compile import compile as compile  # noqa: A001 - onnx2jax.compile(model, mesh)
    from onnx2jax.runtime.executable import Executable as Executable
    from onnx2jax.runtime.decoder import Decoder as Decoder
    from onnx2jax.runtime.generate import Generator as Generator
    from onnx2jax.runtime.load import load as load
    from onnx2jax.runtime.generate import generate as generate
    from onnx2jax.translate import JaxModel as JaxModel
    from onnx2jax.translate import translate as translate
