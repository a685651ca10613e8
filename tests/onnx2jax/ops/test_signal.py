"""DFT, STFT, windows and MelWeightMatrix against onnxruntime (static parameters as initializers)."""

import functools

import numpy as np
import pytest

import opcheck

RNG = np.random.default_rng(0)
# Static inputs (inits=) are initializers; outputs stay untyped; a single output, compared as it is.
check = functools.partial(opcheck.check, rtol=1e-4, atol=1e-4, outputs=None, count="equal", compare="allclose")


@pytest.mark.parametrize(
    "complex_in,attrs,length",
    [
        (False, {}, None),
        (True, {}, None),
        (False, {"onesided": 1}, None),
        (False, {"inverse": 1}, None),
        (True, {"inverse": 1}, None),
        (True, {}, 6),
        (False, {"onesided": 1}, 12),
    ],
)
def test_dft_17(complex_in, attrs, length):
    x = RNG.standard_normal((2, 8, 2 if complex_in else 1)).astype(np.float32)
    n = None if length is None else np.array(length, np.int64)
    check("DFT", 17, [x, n], inits=(1,), axis=1, **attrs)


@pytest.mark.parametrize("axis", [1, -2, 2])
def test_dft_20_axis_input(axis):
    x = RNG.standard_normal((2, 4, 6, 2)).astype(np.float32)
    check("DFT", 20, [x, None, np.array(axis, np.int64)], inits=(2,))


@pytest.mark.parametrize("window", [False, True])
def test_stft(window):
    x = RNG.standard_normal((2, 32, 1)).astype(np.float32)
    w = np.hanning(8).astype(np.float32) if window else None
    check("STFT", 17, [x, np.array(4, np.int64), w, np.array(8, np.int64)], inits=(1, 3))


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    check(op, 17, [np.array(10, np.int64)], inits=(0,), atol=1e-6, periodic=periodic)


def test_window_output_datatype():
    check("HannWindow", 17, [np.array(7, np.int64)], inits=(0,), output_datatype=11)


def test_mel_weight_matrix():
    bins, dft, rate = np.array(8, np.int64), np.array(64, np.int64), np.array(16000, np.int64)
    low, high = np.array(0.0, np.float32), np.array(8000.0, np.float32)
    check("MelWeightMatrix", 17, [bins, dft, rate, low, high], inits=(0, 1, 2, 3, 4), atol=1e-6)
