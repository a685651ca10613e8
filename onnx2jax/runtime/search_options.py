"""genai_config.json's ``search`` options: those onnx2jax implements become the defaults of generation, the
others are refused by name at any value that would change the result, never ignored.

Implemented, as defaults that a call, a CLI flag or a request overrides: ``do_sample``, ``temperature``,
``top_k``, ``top_p`` (these three only where sampling, as onnxruntime-genai applies them), ``repetition_penalty``
(transformers' and onnxruntime-genai's: over the prompt and the tokens generated) and ``random_seed`` (>= 0: the
seed; -1, onnxruntime-genai's "any seed", leaves onnx2jax's default of 0). ``max_length`` is the default length
and ``past_present_share_buffer`` the cache layout (read elsewhere). ``length_penalty`` and ``early_stopping``
act only in beam search, so any value is taken as it changes nothing with one beam. Refused: ``num_beams`` > 1
(beam search), ``num_return_sequences`` > 1, ``min_length`` > 0, ``no_repeat_ngram_size`` > 0,
``diversity_penalty`` != 0, and any option not named here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from onnx2jax.errors import SearchOptionError

IMPLEMENTED = ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty", "random_seed")
READ_ELSEWHERE = ("max_length", "past_present_share_buffer")
BEAM_ONLY = ("length_penalty", "early_stopping")
ONLY_AT = {"num_beams": 1, "num_return_sequences": 1, "min_length": 0, "no_repeat_ngram_size": 0,
           "diversity_penalty": 0}
WHY = {"num_beams": "beam search is not implemented (greedy and sampling are); set it to 1",
       "num_return_sequences": "one sequence per prompt is implemented; set it to 1",
       "min_length": "a minimum length is not implemented; set it to 0",
       "no_repeat_ngram_size": "n-gram blocking is not implemented; set it to 0",
       "diversity_penalty": "diverse beam search is not implemented; set it to 0"}


@dataclasses.dataclass(frozen=True)
class SearchDefaults:
    """The defaults a model folder gives generation (onnxruntime-genai's own where its config leaves one out);
    as made with no arguments, those of a model without a genai_config.json: greedy, sampling unlimited.

    Attributes:
      do_sample: sample (True) or greedy.
      temperature, top_k, top_p: of sampling (top_k 0: no limit).
      repetition_penalty: 1: none.
      seed: the sampling seed, None: onnx2jax's default.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None


OG_TOP_K = 50
"""onnxruntime-genai's top_k where a genai_config.json leaves it out."""


def search_defaults(search: Mapping[str, Any], source: str = "") -> SearchDefaults | None:
    """The defaults of a genai_config.json's ``search`` section, checked; None for an empty one (a model
    without genai_config.json: the caller's own defaults hold).

    Raises:
      SearchOptionError: an option at a value onnx2jax does not implement, or an option it does not know,
        named with ``source`` (the config's path) and what to do.
    """
    for option, value in search.items():
        if option in ONLY_AT:
            if value is None or _number(option, value, source) == ONLY_AT[option]:
                continue
            raise SearchOptionError(option, value, source, WHY[option])
        if option not in IMPLEMENTED + READ_ELSEWHERE + BEAM_ONLY:
            raise SearchOptionError(option, value, source, "not an option onnx2jax knows; remove it (nothing "
                                    "is ignored)")
    if not search:
        return None
    base = SearchDefaults()
    seed = search.get("random_seed", -1)
    seed = int(_number("random_seed", seed, source))
    do_sample = search.get("do_sample", base.do_sample)
    if not isinstance(do_sample, bool):
        raise SearchOptionError("do_sample", do_sample, source, "must be true or false")
    return SearchDefaults(
        do_sample=do_sample,
        temperature=float(_number("temperature", search.get("temperature", base.temperature), source)),
        top_k=int(_number("top_k", search.get("top_k", OG_TOP_K), source)),
        top_p=float(_number("top_p", search.get("top_p", base.top_p), source)),
        repetition_penalty=float(_number("repetition_penalty", search.get("repetition_penalty", 1.0), source)),
        seed=seed if seed >= 0 else None,
    )


def _number(option: str, value: Any, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SearchOptionError(option, value, source, "must be a number")
    return value


def folder_defaults(folder: str | os.PathLike) -> SearchDefaults | None:
    """:func:`search_defaults` of the folder's genai_config.json (None without one), read without loading the
    model: a command refuses an unimplemented option before it loads anything."""
    path = os.path.join(os.fspath(folder), "genai_config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return search_defaults(json.load(f).get("search") or {}, path)
