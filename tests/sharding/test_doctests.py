"""The examples in the package's docstrings run and print what they say."""

import doctest

import pytest

from sharding import nanotron, spec, text, tiles, validate, visualize


@pytest.mark.parametrize("module", [nanotron, spec, text, tiles, validate, visualize])
def test_docstring_examples(module):
    globs = {**vars(module), "np": tiles.np}
    result = doctest.testmod(module, globs=globs, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0
