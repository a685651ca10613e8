"""TfIdfVectorizer: counts of pooled n-grams (with skips) per row, weighted.

Which n-grams a row holds depends only on its length, so every candidate is
a static set of token positions: for skip distance ``d`` (1 to
``max_skip_count + 1``), start ``s`` and size ``n``, the tokens at
``s, s + d, ..., s + (n - 1) d``. For each size, all candidates are compared
with all pooled n-grams of that size at once, and the matches are summed into
their output columns. Unigrams are counted once, not once per skip distance
(as ONNX's reference and onnxruntime do).

Worked example: a row ``[1, 2, 3]``, bigrams, ``max_skip_count=1``: ``d = 1``
gives (1, 2) and (2, 3); ``d = 2`` gives (1, 3).

Integer inputs may be traced; string inputs are values known while tracing
(JAX has no strings) and run the same code in numpy.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register


def _pool(ngram_counts, ngram_indexes, pool: list, min_n: int, max_n: int) -> dict[int, dict[tuple, int]]:
    """size -> {n-gram: output column}, for the sizes in [min_n, max_n] (a repeated n-gram keeps its last column)."""
    starts = list(ngram_counts) + [len(pool)]
    by_size: dict[int, dict[tuple, int]] = {}
    ngram_id = 0
    for size, (begin, end) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        for first in range(begin, end - size + 1, size):
            if min_n <= size <= max_n:
                by_size.setdefault(size, {})[tuple(pool[first : first + size])] = int(ngram_indexes[ngram_id])
            ngram_id += 1
    return by_size


@register("TfIdfVectorizer", 9)
def tfidf_vectorizer(
    x, *, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts, ngram_indexes,
    pool_int64s=None, pool_strings=None, weights=None,
):
    """[B, columns] (or [columns] for a 1-D input) float32 n-gram statistics of each row of ``x``."""
    strings = isinstance(x, np.ndarray) and x.dtype.kind in "OUS"
    xp = np if strings or isinstance(x, (np.ndarray, np.generic)) else jnp
    if strings:
        x = np.vectorize(lambda s: s.decode("utf-8") if isinstance(s, bytes) else str(s), otypes=[object])(x)
        pool: list = list(pool_strings or ())
    else:
        pool = [int(v) for v in pool_int64s or ()]
    rows = x.reshape(1, -1) if x.ndim <= 1 else x
    if rows.ndim != 2:
        raise ValueError(f"TfIdfVectorizer takes a [C] or [B, C] tensor, got shape {x.shape}")
    width = rows.shape[1]
    columns = max(ngram_indexes) + 1
    counts = xp.zeros((rows.shape[0], columns), np.float32)
    for size, grams in _pool(ngram_counts, ngram_indexes, pool, min_gram_length, max_gram_length).items():
        starts = []
        for d in range(1, max_skip_count + 2):
            if size == 1 and d > 1:
                break  # unigrams are counted once
            starts += [[s + k * d for k in range(size)] for s in range(width) if s + (size - 1) * d < width]
        if not starts:
            continue
        tokens = rows[:, np.asarray(starts)]  # [B, candidates, size]
        table = np.array(list(grams), dtype=object if strings else np.int64).reshape(len(grams), size)
        hits = xp.all(tokens[:, :, None, :] == table[None, None, :, :], axis=-1)  # [B, candidates, pooled]
        found = xp.sum(hits, axis=1).astype(np.float32)  # [B, pooled]
        target = np.zeros((len(grams), columns), np.float32)
        target[np.arange(len(grams)), list(grams.values())] = 1
        counts = counts + found @ target
    scale = np.asarray(weights, np.float32) if weights else np.ones(columns, np.float32)
    if mode == "TF":
        out = counts
    elif mode == "IDF":
        out = xp.where(counts > 0, scale, np.float32(0))
    elif mode == "TFIDF":
        out = counts * scale
    else:
        raise ValueError(f"TfIdfVectorizer: unknown mode {mode!r}")
    return out.reshape(columns) if x.ndim <= 1 else out
