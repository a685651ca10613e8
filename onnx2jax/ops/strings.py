"""String ops: StringConcat, StringNormalizer, StringSplit, RegexFullMatch.

JAX has no string dtype, so these run only on values known while tracing
(string constants and what is computed from them); a string tensor that
depends on runtime inputs cannot reach them.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from onnx2jax.ops.registry import register


def _strings(x, op: str) -> np.ndarray:
    if not isinstance(x, (np.ndarray, np.generic)):
        raise NotImplementedError(f"{op} needs string values known while tracing; JAX has no string dtype")
    x = np.asarray(x)
    if x.dtype.kind not in "OUS":
        raise TypeError(f"{op} takes string tensors, got {x.dtype}")
    return np.vectorize(lambda s: s.decode("utf-8") if isinstance(s, bytes) else str(s), otypes=[object])(x) if x.size else x.astype(object)


@register("StringConcat", 20)
def string_concat(x, y):
    x, y = _strings(x, "StringConcat"), _strings(y, "StringConcat")
    return np.asarray(np.char.add(x.astype(np.str_), y.astype(np.str_)), dtype=object)


@register("RegexFullMatch", 20)
def regex_full_match(x, *, pattern):
    # ONNX specifies RE2 syntax; Python's re accepts the RE2 patterns models use.
    regex = re.compile(pattern)
    x = _strings(x, "RegexFullMatch")
    return np.vectorize(lambda s: regex.fullmatch(s) is not None, otypes=[np.bool_])(x).reshape(x.shape)


@register("StringSplit", 20)
def string_split(x, *, delimiter=None, maxsplit=None):
    x = _strings(x, "StringSplit")
    separator = delimiter or None  # "" or unset: split on runs of whitespace
    limit = -1 if maxsplit is None else int(maxsplit)
    parts = [s.split(separator, limit) for s in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    out = np.array([p + [""] * (width - len(p)) for p in parts], dtype=object).reshape(*x.shape, width)
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    return out, counts


def _strip_accents(s: str) -> str:
    if s.isascii():
        return s
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


@register("StringNormalizer", 10)
def string_normalizer(x, *, case_change_action, is_case_sensitive, locale=None, stopwords=None):
    """Follows ONNX's reference: strip accents, drop stopwords, change case, drop emptied elements.

    Only [C] and [1, C] inputs are allowed; an all-dropped result is [""] (or [[""]]).
    """
    x = _strings(x, "StringNormalizer")
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ValueError(f"StringNormalizer takes a [C] or [1, C] tensor, got shape {x.shape}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"unknown case_change_action {case_change_action!r}")
    change = {"LOWER": str.lower, "UPPER": str.upper}.get(case_change_action, lambda s: s)
    raw_stops = set(stopwords or ())
    stops = {change(w) for w in raw_stops}

    def drop(text: str, words: set) -> str:
        return " ".join(w for w in text.split(" ") if w not in words)

    words = [_strip_accents(s) for s in x.reshape(-1)]
    if is_case_sensitive and raw_stops:
        words = [drop(w, raw_stops) for w in words]
    words = [change(w) for w in words]
    if not is_case_sensitive and stops:
        words = [drop(w, stops) for w in words]
    kept = [w for w in words if w] or [""]
    out = np.array(kept, dtype=object)
    return out.reshape(1, -1) if x.ndim == 2 else out
