"""onnxruntime as the tests' independent reference, and the comparison with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort


def onnxruntime_outputs(model: onnx.ModelProto, feeds: Mapping[str, Any]) -> list:
    """Every graph output of ``model`` run by onnxruntime on the CPU (one intra-op thread: the tests share 2 cores)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, dict(feeds))


def assert_same_outputs(ours: Sequence[Any], theirs: Sequence[np.ndarray], *, rtol: float, atol: float) -> None:
    """As many outputs, each of the reference's shape and dtype, values within ``rtol``/``atol``."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        a = np.asarray(a)
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
