"""The files that ship inside the package: the demo model, and the small models and inputs of the guides' examples.

They live in ``onnx2jax/data`` (in the wheel too), so examples run from any folder:

    >>> import onnx2jax
    >>> model = onnx2jax.translate(onnx2jax.demo_model_path())           # doctest: +SKIP
    >>> ids = np.load(onnx2jax.data_path("tiny_llama.inputs.npz"))       # doctest: +SKIP

The files: ``tiny_llama.onnx`` (the demo's tiny Llama: RoPE, grouped-query attention, RMSNorm, a SiLU-gated
MLP) with ``tiny_llama.inputs.npz`` and onnxruntime's ``tiny_llama.ort_outputs.npz``; ``random_forest.onnx``
(scikit-learn, with ``random_forest.inputs.npz``); ``detection_head.onnx`` (a detection head ending in
NonMaxSuppression, with ``detection_head.inputs.npz`` and onnxruntime's ``detection_head.ort_outputs.npz``);
the folders ``llama_gqa`` (an onnxruntime-genai model-builder folder: GroupQueryAttention, a KV cache) and
``llama_gqa_torch`` (a torch export with ``past_key_values``), the decoders of ``onnx2jax.generate``'s examples
(``tests/data/genai/README.md`` says how they were made).

On the command line ``onnx2jax data`` lists them and ``onnx2jax data NAME`` prints a path; wherever a
command takes a model or an input file, ``data:NAME`` names one of them (``data:tiny_llama`` is
``tiny_llama.onnx``: see :func:`resolve`), so every documented command runs from any folder.
"""

from __future__ import annotations

import pathlib

DATA = pathlib.Path(__file__).resolve().parent / "data"

FILES = (
    "tiny_llama.onnx", "tiny_llama.inputs.npz", "tiny_llama.ort_outputs.npz",
    "random_forest.onnx", "random_forest.inputs.npz",
    "detection_head.onnx", "detection_head.inputs.npz", "detection_head.ort_outputs.npz",
    "llama_gqa", "llama_gqa_torch",
)
"""Every file or folder :func:`data_path` gives (the wheel ships each: tests/test_wheel.py)."""


def data_path(name: str) -> pathlib.Path:
    """The path of a file or folder that ships with onnx2jax (see the module docstring for the list).

    Raises:
      FileNotFoundError: no such file ships, listing the ones that do.
    """
    if name not in FILES:
        raise FileNotFoundError(f"onnx2jax ships no file {name!r}; it ships {', '.join(FILES)}")
    return DATA / name


PREFIX = "data:"
"""How a command-line argument names a shipped file: ``data:tiny_llama.onnx``, or ``data:tiny_llama``."""

DESCRIPTIONS = {
    "tiny_llama.onnx": "the demo's tiny Llama (RoPE, grouped-query attention, RMSNorm, SiLU MLP), torch export",
    "tiny_llama.inputs.npz": "input_ids for tiny_llama.onnx",
    "tiny_llama.ort_outputs.npz": "onnxruntime's logits for those inputs",
    "random_forest.onnx": "a scikit-learn random forest (ai.onnx.ml TreeEnsemble)",
    "random_forest.inputs.npz": "inputs for random_forest.onnx",
    "detection_head.onnx": "a detection head ending in NonMaxSuppression (data-dependent shapes)",
    "detection_head.inputs.npz": "inputs for detection_head.onnx",
    "detection_head.ort_outputs.npz": "onnxruntime's outputs for those inputs",
    "llama_gqa": "an onnxruntime-genai folder: GroupQueryAttention decoder with a KV cache",
    "llama_gqa_torch": "a torch-exported decoder with past_key_values",
}
"""One line per shipped file, for ``onnx2jax data``."""


def find(name: str) -> str:
    """The shipped file ``name`` names: itself, or ``name + ".onnx"`` (``tiny_llama`` -> ``tiny_llama.onnx``).

    Raises:
      FileNotFoundError: no such file ships, listing the ones that do.
    """
    for candidate in (name, f"{name}.onnx"):
        if candidate in FILES:
            return candidate
    return data_path(name).name  # raises, listing FILES


def resolve(argument: str) -> str:
    """A command-line path argument with ``data:NAME`` made the shipped file's path; any other is returned as is.

    ``data:FOLDER/FILE`` names a file inside a shipped folder (``data:llama_gqa/model.onnx``).

    Raises:
      FileNotFoundError: ``data:NAME`` where no such file ships, listing the ones that do.
    """
    if not argument.startswith(PREFIX):
        return argument
    head, sep, rest = argument[len(PREFIX):].partition("/")
    if sep and head in FILES:  # a file inside a shipped folder: data:llama_gqa/model.onnx
        return str(data_path(head) / rest)
    return str(data_path(find(argument[len(PREFIX):])))


def demo_model_path() -> pathlib.Path:
    """The path of the demo model, the tiny Llama that ``onnx2jax demo`` annotates and runs."""
    return data_path("tiny_llama.onnx")
