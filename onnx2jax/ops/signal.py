"""Signal processing: DFT, STFT, window functions and MelWeightMatrix.

ONNX keeps complex numbers as a trailing axis of size 2 (real, imaginary); a
trailing axis of size 1 is a real signal. Windows and the mel matrix depend
only on static inputs, so they are computed with numpy while tracing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import onnx.helper

from onnx2jax.ops.registry import register


def _to_complex(x):
    """[..., 1] real or [..., 2] (re, im) -> a complex array without the trailing axis."""
    x = jnp.asarray(x)
    if x.dtype not in (jnp.float32, jnp.float64):
        x = x.astype(jnp.float32)
    if x.shape[-1] == 1:
        return x[..., 0]
    return jax.lax.complex(x[..., 0], x[..., 1])


def _from_complex(z, dtype):
    return jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1).astype(dtype)


def _dft(x, dft_length, axis, inverse, onesided):
    x = jnp.asarray(x)
    axis = axis % x.ndim
    if axis == x.ndim - 1:
        raise ValueError("the DFT axis cannot be the last (real/imaginary) axis")
    n = x.shape[axis] if dft_length is None else int(np.asarray(dft_length).reshape(()))
    if dft_length is None and inverse and onesided:
        n = 2 * (x.shape[axis] - 1)
    signal = _to_complex(x)
    if inverse:
        if onesided:
            return jnp.fft.irfft(signal, n=n, axis=axis)[..., None].astype(x.dtype)
        return _from_complex(jnp.fft.ifft(signal, n=n, axis=axis), x.dtype)
    if x.shape[-1] == 1:
        # A real signal: rfft keeps the DC and Nyquist bins exactly real; the other half
        # of the spectrum is the conjugate mirror of bins 1 .. ceil(n/2)-1.
        half = jnp.fft.rfft(signal, n=n, axis=axis)
        if onesided:
            return _from_complex(half, x.dtype)
        mirror = jnp.conj(jnp.flip(jnp.take(half, jnp.arange(1, (n + 1) // 2), axis=axis), axis))
        return _from_complex(jnp.concatenate([half, mirror], axis=axis), x.dtype)
    result = jnp.fft.fft(signal, n=n, axis=axis)
    if onesided:
        result = jnp.take(result, jnp.arange(n // 2 + 1), axis=axis)
    return _from_complex(result, x.dtype)


@register("DFT", 17, static_inputs=(1,))
def dft_17(x, dft_length=None, *, axis, inverse, onesided):
    return _dft(x, dft_length, axis, inverse, onesided)


@register("DFT", 20, static_inputs=(1, 2))
def dft(x, dft_length=None, axis=None, *, inverse, onesided):
    axis = -2 if axis is None else int(np.asarray(axis).reshape(()))
    return _dft(x, dft_length, axis, inverse, onesided)


@register("STFT", 17, static_inputs=(1, 3))
def stft(signal, frame_step, window=None, frame_length=None, *, onesided):
    signal = jnp.asarray(signal)
    step = int(np.asarray(frame_step).reshape(()))
    if frame_length is not None:
        length = int(np.asarray(frame_length).reshape(()))
    elif window is not None:
        length = jnp.shape(window)[0]
    else:
        raise ValueError("STFT needs a window or a frame_length")
    if window is None:
        window = jnp.ones((length,), signal.dtype)
    frames = 1 + (signal.shape[1] - length) // step
    # Frame f covers samples f*step .. f*step+length-1: an index array [frames, length].
    index = np.arange(frames)[:, None] * step + np.arange(length)[None, :]
    framed = signal[:, index, :]  # [batch, frames, length, 1 or 2]
    framed = framed * jnp.asarray(window).astype(signal.dtype)[None, None, :, None]
    return _dft(framed, None, 2, 0, onesided)


def _window_dtype(output_datatype):
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(output_datatype))


def _window_points(size, periodic):
    n = int(np.asarray(size).reshape(()))
    return np.arange(n, dtype=np.float64), (n if periodic else n - 1)


@register("HannWindow", 17, static_inputs=(0,))
def hann_window(size, *, output_datatype, periodic):
    k, denom = _window_points(size, periodic)
    return (np.sin(k * np.pi / denom) ** 2).astype(_window_dtype(output_datatype))


@register("HammingWindow", 17, static_inputs=(0,))
def hamming_window(size, *, output_datatype, periodic):
    k, denom = _window_points(size, periodic)
    alpha = 25.0 / 46.0
    return (alpha - (1 - alpha) * np.cos(2 * np.pi * k / denom)).astype(_window_dtype(output_datatype))


@register("BlackmanWindow", 17, static_inputs=(0,))
def blackman_window(size, *, output_datatype, periodic):
    k, denom = _window_points(size, periodic)
    values = 0.42 - 0.5 * np.cos(2 * np.pi * k / denom) + 0.08 * np.cos(4 * np.pi * k / denom)
    return values.astype(_window_dtype(output_datatype))


@register("MelWeightMatrix", 17, static_inputs=(0, 1))
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *, output_datatype):
    bins = int(np.asarray(num_mel_bins))
    length = int(np.asarray(dft_length))
    edges_static = all(isinstance(v, (np.ndarray, np.generic)) for v in (sample_rate, lower_edge_hertz, upper_edge_hertz))
    xp = np if edges_static else jnp  # numpy (float64) when the band edges are known while tracing
    low_mel = 2595 * xp.log1p(xp.asarray(lower_edge_hertz) / 700) / np.log(10)
    high_mel = 2595 * xp.log1p(xp.asarray(upper_edge_hertz) / 700) / np.log(10)
    points = np.arange(bins + 2) * ((high_mel - low_mel) / (bins + 2)) + low_mel
    hertz = 700 * xp.expm1(points / 2595 * np.log(10))
    edges = xp.floor((length + 1) * hertz / xp.asarray(sample_rate)).astype(xp.int32)
    # Triangle i rises from edges[i] to edges[i+1] and falls to edges[i+2]; j is the spectrogram bin.
    j = np.arange(length // 2 + 1)[:, None]
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    rise = xp.where(
        center == left,
        (j == center).astype(np.float64),
        xp.where((j >= left) & (j <= center), (j - left) / xp.maximum(center - left, 1), 0.0),
    )
    falling = (right > center) & (j >= center) & (j < right)
    out = xp.where(falling, (right - j) / xp.maximum(right - center, 1), rise)
    return out.astype(_window_dtype(output_datatype))
