"""Prediction = program (issue 23): the report sets the compiled HLO's collectives, by ONNX node,
against those inference predicts, and names every collective XLA adds: node, kind and why."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from test_compile_conv import _block

import onnx2jax
from onnx2jax.runtime.constraints import ShardingHooks


@pytest.fixture(autouse=True)
def _fresh_compiles():
    """An executable from the persistent cache keeps the metadata (op_name scopes) of the program
    first compiled for its key; these tests read the scopes of this program."""
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    yield
    jax.config.update("jax_enable_compilation_cache", before)


def test_agreement_is_stated():
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    compiled = onnx2jax.compile(_block(8))
    compiled(x)
    notes = compiled.report(x).notes
    assert "the program's 1 collectives are those inference predicted, node by node" in notes


def test_what_xla_adds_is_named_by_node(monkeypatch):
    """Without the batched-over-groups lowering, XLA gathers the grouped conv (docs/known-issues.md):
    the report names conv2 and the reason; inference predicted no collective there."""
    monkeypatch.setattr(ShardingHooks, "_groups_split", lambda self, node, inputs, attrs: False)
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    compiled = onnx2jax.compile(_block(8))
    compiled(x)
    added = [n for n in compiled.report(x).notes if n.startswith("XLA added")]
    assert added and all("at node 'conv2'" in n for n in added), added
    assert any("all-gather" in n and "gathers this convolution's operands" in n for n in added), added
