"""What generation checks before it runs: the prompt's token ids, and the ids it feeds the model.

``onnx2jax run`` refuses an index past its table on the host (:mod:`onnx2jax.input_checks`), because XLA
answers anyway (a clamped row, or NaN). Generation feeds the same ``input_ids`` through its own programs,
under ``jit`` where nothing concrete can be checked, so it checks the prompts here, once, before the
prefill: :func:`check_prompts` refuses ids that are not integers (:class:`~onnx2jax.errors.InputError`)
and ids outside ``[0, vocabulary)`` (:class:`~onnx2jax.errors.InputRangeError`; a negative id, which ONNX's
Gather reads from the end, is no token). (Too many devices is refused where the handle is loaded,
:mod:`onnx2jax.runtime.load`, as ``compile`` refuses it: a :class:`~onnx2jax.errors.DeviceCountError`.)

:func:`model_ids` is the other side of the same rule: a pad id is a value to fill rows with, never an index
to gather. onnxruntime-genai allows ``pad_token_id`` outside the vocabulary (a qwen2 config whose pad is
the vocabulary size); the loop pads prompts and fills finished rows with it, and a Gather of it gives NaN
rows (``jnp.take``'s fill mode) that reach every real token through the attention (0 x NaN). Since the
user's ids were checked, any id outside the vocabulary that reaches the model is the loop's own fill;
:func:`model_ids` feeds id 0 there instead (the positions are masked: any id gives the same tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnx2jax.errors import InputError, TokenIdError


def vocabulary(index_uses: Sequence[Any], input_ids: str, vocab_size: int | None) -> int | None:
    """The number of token ids ``input_ids`` may hold: the size of the table its Gather reads (as ``run``
    checks it; :func:`onnx2jax.input_checks.index_uses`), else the config's or the logits' vocabulary."""
    bounds = [use.bounds[0] for use in index_uses if use.input == input_ids and len(use.bounds) == 1]
    return min(bounds) if bounds else vocab_size


def check_prompts(raw: Any, prompts: Sequence[Sequence[Any]], bound: int | None, input_ids: str = "input_ids") -> None:
    """Refuses prompts whose ids are not integers or lie outside ``[0, bound)``.

    Args:
      raw: the ``input_ids`` as the caller gave them (one prompt, ragged prompts, a 2-D array).
      prompts: the same read as lists, a 2-D array's pads stripped (pads may lie outside the vocabulary).
      bound: the vocabulary (:func:`vocabulary`); None checks only the type and the sign.
      input_ids: the graph input's name, for the message.

    Raises:
      InputError: a float, bool or other non-integer id (naming the first and its place).
      InputRangeError: an id below 0 or at or past ``bound`` (naming the prompt, the position, the value).
    """
    _check_integers(raw)
    for row, prompt in enumerate(prompts):
        array = np.asarray(prompt, dtype=np.int64)
        bad = np.flatnonzero((array < 0) | (array >= (bound if bound is not None else np.iinfo(np.int64).max)))
        if bad.size:
            at = int(bad[0])
            raise TokenIdError(input_ids, (row, at), int(array[at]), bound)


def _check_integers(raw: Any) -> None:
    """Refuses ids that are not integers: a float array or list element, a bool, a string."""
    if isinstance(raw, np.ndarray) or hasattr(raw, "shape"):
        array = np.asarray(raw)
        if array.dtype.kind not in "iu":
            raise InputError(f"input_ids must be integer token ids, got an array of {array.dtype}")
        return
    rows = [raw] if len(raw) and np.ndim(raw[0]) == 0 else raw
    for r, row in enumerate(rows):
        for i, token in enumerate(row):
            if isinstance(token, (bool, np.bool_)) or not isinstance(token, (int, np.integer)):
                raise InputError(
                    f"input_ids must be integer token ids; prompt {r}, position {i} is {token!r} "
                    f"({type(token).__name__})"
                )


def model_ids(ids: Any, bound: int | None) -> Any:
    """``ids`` as fed to the model: the loop's fills outside ``[0, bound)`` (pad ids) become 0 (module
    docstring); ids in the vocabulary are unchanged. Traceable (jax arrays) and host-side alike."""
    if bound is None:
        return ids
    import jax.numpy as jnp

    return jnp.where((ids >= 0) & (ids < bound), ids, jnp.zeros((), ids.dtype))
