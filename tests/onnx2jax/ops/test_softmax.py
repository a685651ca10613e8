"""Softmax, LogSoftmax and Hardmax against onnxruntime (opset 1/11 coerce-to-2D, opset 13 per axis)."""

import numpy as np
import pytest

from opcheck import check, normal_arrays

RNG = np.random.default_rng(0)
_f = normal_arrays(RNG)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axis", [None, 0, -1])
def test_softmax_family(op, opset, axis):
    x = _f(2, 3, 4)
    if op == "Hardmax":
        x = RNG.integers(0, 3, (2, 3, 4)).astype(np.float32)  # ties: the first maximum wins
    attrs = {} if axis is None else {"axis": axis}
    if opset == 1 and axis == -1:
        pytest.skip("negative axes arrived in opset 11")
    check(op, opset, [x], rtol=1e-5, atol=1e-6, **attrs)


def test_softmax_float16():
    check("Softmax", 13, [_f(2, 8, dtype=np.float16)], rtol=2e-3, atol=1e-3)
