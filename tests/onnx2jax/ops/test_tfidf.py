"""TfIdfVectorizer against onnxruntime: integer inputs traced, string inputs known while tracing."""

import functools

import numpy as np
import pytest

from tests.onnx2jax.ops import opcheck

check = functools.partial(opcheck.check, ai_onnx_opset=19, compare="allclose")
POOL = dict(ngram_counts=[0, 4], ngram_indexes=[0, 1, 2, 3, 4, 5, 6])
INTS = np.array([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], np.int32)


@pytest.mark.parametrize(
    "attrs",
    [
        dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=0),
        dict(mode="TF", min_gram_length=1, max_gram_length=2, max_skip_count=3),
        dict(mode="IDF", min_gram_length=1, max_gram_length=2, max_skip_count=1, weights=[0.5, 1, 2, 3, 4, 5, 6]),
        dict(mode="TFIDF", min_gram_length=1, max_gram_length=2, max_skip_count=5, weights=[0.5, 1, 2, 3, 4, 5, 6]),
    ],
)
def test_integers(attrs):
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7]  # unigrams 2 3 5 4; bigrams (5,6) (7,8) (6,7)
    check("TfIdfVectorizer", 19, [INTS], pool_int64s=pool, **POOL, **attrs)
    check("TfIdfVectorizer", 19, [INTS[1].astype(np.int64)], pool_int64s=pool, **POOL, **attrs)


def test_strings():
    x = np.array([["a", "b", "c", "a", "b"], ["c", "c", "b", "a", "x"]], dtype=object)
    check("TfIdfVectorizer", 19, [x], pool_strings=["a", "b", "c", "x", "a", "b", "c", "a", "b", "a"],
          ngram_counts=[0, 4], ngram_indexes=[3, 2, 1, 0, 4, 5, 6], mode="TF", min_gram_length=1,
          max_gram_length=2, max_skip_count=1)
