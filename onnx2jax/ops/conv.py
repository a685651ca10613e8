"""Convolutions: Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
from onnx2jax.numerics import dot_precision


def spatial_pads(auto_pad, in_shape, kernel, strides, dilations, pads):
    """ONNX padding attributes -> [(begin, end)] per spatial axis.

    SAME_* pads so that out = ceil(in / stride): the total padding is
    max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - in), and
    SAME_UPPER puts the odd pixel at the end, SAME_LOWER at the beginning.
    E.g. in=5, kernel=3, stride=2: out=3, total=max(0, 4 + 3 - 5)=2 -> (1, 1).
    """
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        totals = [
            max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            for size, k, s, d in zip(in_shape, kernel, strides, dilations)
        ]
        return _split_totals(totals, auto_pad)
    return _explicit_pads(auto_pad, pads, len(in_shape))


def _split_totals(totals, auto_pad):
    """Total padding per axis -> (begin, end); SAME_UPPER puts the odd pixel at the end."""
    pairs = [(total // 2, total - total // 2) for total in totals]
    return pairs if auto_pad == "SAME_UPPER" else [(end, begin) for begin, end in pairs]


def _explicit_pads(auto_pad, pads, n):
    """``pads`` as [(begin, end)] per axis (all zero for VALID or when absent)."""
    if auto_pad == "VALID" or pads is None:
        return [(0, 0)] * n
    pads = [int(p) for p in pads]
    return list(zip(pads[:n], pads[n:]))


def _defaults(x, kernel, strides, dilations):
    n = x.ndim - 2
    strides = tuple(int(s) for s in strides) if strides else (1,) * n
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * n
    return tuple(int(k) for k in kernel), strides, dilations


def _dimension_numbers(n):
    spatial = "DHW"[-n:] if n <= 3 else "".join(chr(ord("a") + i) for i in range(n))
    lhs = "NC" + spatial
    return jax.lax.conv_dimension_numbers((1, 1) + (1,) * n, (1, 1) + (1,) * n, (lhs, "OI" + spatial, lhs))


def _conv(x, w, padding, strides, dilations, group, lhs_dilation=None):
    return jax.lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=padding,
        lhs_dilation=lhs_dilation,
        rhs_dilation=dilations,
        dimension_numbers=_dimension_numbers(x.ndim - 2),
        feature_group_count=group,
        precision=dot_precision(x, w),
    )


def _add_bias(y, b):
    if b is None:
        return y
    return y + jnp.asarray(b).reshape((-1,) + (1,) * (y.ndim - 2))


@register("Conv", 1, 11, 22)
def conv(x, w, b=None, *, auto_pad, group, kernel_shape=None, pads=None, strides=None, dilations=None):
    kernel, strides, dilations = _defaults(x, kernel_shape or w.shape[2:], strides, dilations)
    padding = spatial_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads)
    y = _conv(x, w.astype(x.dtype), padding, strides, dilations, group)
    return _add_bias(y, b).astype(x.dtype)


def _transpose_pads(auto_pad, in_shape, kernel, strides, dilations, pads, output_padding, output_shape):
    """Begin/end padding of ConvTranspose, following the ONNX spec's formulas.

    The full output of one input pixel spans (k - 1) * d + 1; the unpadded size
    is s * (in - 1) + output_padding + (k - 1) * d + 1, from which pads crop.
    """
    n = len(in_shape)
    full = [
        s * (size - 1) + op + (k - 1) * d + 1
        for size, k, s, d, op in zip(in_shape, kernel, strides, dilations, output_padding)
    ]
    if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        if output_shape is not None:
            target = [int(v) for v in output_shape][-n:]
        else:
            target = [size * s for size, s in zip(in_shape, strides)]
        return _split_totals([f - t for f, t in zip(full, target)], auto_pad)
    return _explicit_pads(auto_pad, pads, n)


@register("ConvTranspose", 1, 11, 22)
def conv_transpose(
    x,
    w,
    b=None,
    *,
    auto_pad,
    group,
    kernel_shape=None,
    pads=None,
    strides=None,
    dilations=None,
    output_padding=None,
    output_shape=None,
):
    n = x.ndim - 2
    kernel, strides, dilations = _defaults(x, kernel_shape or w.shape[2:], strides, dilations)
    output_padding = tuple(int(p) for p in output_padding) if output_padding else (0,) * n
    crop = _transpose_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads, output_padding, output_shape)
    # W is (C_in, C_out / group, k...); a transposed conv is a conv of the
    # stride-dilated input with the flipped kernel laid out (C_out, C_in / group, k...).
    c_in, c_out_g = w.shape[0], w.shape[1]
    rhs = w.astype(x.dtype).reshape((group, c_in // group, c_out_g) + tuple(w.shape[2:]))
    rhs = jnp.swapaxes(rhs, 1, 2).reshape((group * c_out_g, c_in // group) + tuple(w.shape[2:]))
    rhs = jnp.flip(rhs, axis=tuple(range(2, 2 + n)))
    padding = []
    for k, d, op, (lo, hi) in zip(kernel, dilations, output_padding, crop):
        edge = (k - 1) * d
        padding.append((edge - lo, edge - hi + op))
    # Negative padding crops; apply it as a slice to stay within what every backend accepts.
    positive = [(max(lo, 0), max(hi, 0)) for lo, hi in padding]
    y = _conv(x, rhs, positive, (1,) * n, dilations, group, lhs_dilation=strides)
    index = [slice(None), slice(None)]
    for (lo, hi), size in zip(padding, y.shape[2:]):
        index.append(slice(max(-lo, 0), size - max(-hi, 0)))
    y = y[tuple(index)]
    return _add_bias(y, b).astype(x.dtype)


@register("Col2Im", 18, static_inputs=(1, 2))
def col2im(x, image_shape, block_shape, *, dilations=None, pads=None, strides=None):
    image_shape = tuple(int(v) for v in np.asarray(image_shape))
    block_shape = tuple(int(v) for v in np.asarray(block_shape))
    n = len(image_shape)
    strides = tuple(int(s) for s in strides) if strides else (1,) * n
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * n
    pads = [int(p) for p in pads] if pads else [0] * (2 * n)
    batch, cols, length = x.shape
    channels = cols // int(np.prod(block_shape))
    padded = [s + pads[i] + pads[i + n] for i, s in enumerate(image_shape)]
    counts = [(p - (d * (k - 1) + 1)) // s + 1 for p, k, s, d in zip(padded, block_shape, strides, dilations)]
    blocks = x.reshape((batch, channels) + block_shape + tuple(counts))
    out = jnp.zeros((batch, channels) + tuple(padded), x.dtype)
    # Scatter-add each kernel offset's block of positions into the padded image.
    for offset in np.ndindex(*block_shape):
        index = [slice(None), slice(None)]
        for o, d, s, c in zip(offset, dilations, strides, counts):
            start = o * d
            index.append(slice(start, start + s * (c - 1) + 1, s))
        out = out.at[tuple(index)].add(blocks[(slice(None), slice(None)) + offset])
    crop = [slice(None), slice(None)] + [slice(pads[i], pads[i] + image_shape[i]) for i in range(n)]
    return out[tuple(crop)]


@register("CausalConvWithState", 27)
def causal_conv_with_state(x, w, b=None, past_state=None, *, activation):
    batch, channels, _ = x.shape
    k = w.shape[2]
    if past_state is None:
        past_state = jnp.zeros((batch, channels, k - 1), x.dtype)
    padded = jnp.concatenate([past_state.astype(x.dtype), x], axis=2)
    y = _add_bias(_conv(padded, w.astype(x.dtype), [(0, 0)], (1,), (1,), channels), b).astype(x.dtype)
    if activation in ("silu", "swish"):
        y32 = y.astype(jnp.float32)
        y = (y32 * jax.nn.sigmoid(y32)).astype(x.dtype)
    elif activation != "none":
        raise ValueError(f"CausalConvWithState: unknown activation {activation!r}")
    present = padded[:, :, padded.shape[2] - (k - 1) :]
    return y, present


@register("DeformConv", 19, 22)
def deform_conv(
    x, w, offset, b=None, mask=None, *, group, offset_group, dilations=None, kernel_shape=None, pads=None,
    strides=None,
):
    # 2-D only (as ONNX's reference and onnxruntime). Each output pixel (i, j)
    # reads kernel tap (u, v) at (i*s - pad + u*d + offset_y, j*s - pad + v*d + offset_x),
    # bilinearly with zeros outside the image; the result is a grouped conv over those columns.
    if x.ndim != 4:
        raise NotImplementedError(f"DeformConv: only 2-D inputs are supported, got rank {x.ndim}")
    n, c, height, width = x.shape
    oc = w.shape[0]
    kh, kw = (int(k) for k in (kernel_shape or w.shape[2:]))
    sh, sw = (int(s) for s in strides) if strides else (1, 1)
    dh, dw = (int(d) for d in dilations) if dilations else (1, 1)
    pads = [int(p) for p in pads] if pads else [0, 0, 0, 0]
    oh, ow = offset.shape[2:]
    offset = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
    if mask is None:
        mask = jnp.ones((n, offset_group, kh, kw, oh, ow), x.dtype)
    mask = mask.reshape(n, offset_group, kh, kw, oh, ow)
    base_h = (np.arange(oh) * sh - pads[0])[None, :, None] + (np.arange(kh) * dh)[:, None, None]  # (kh, oh, 1)
    base_w = (np.arange(ow) * sw - pads[1])[None, None, :] + (np.arange(kw) * dw)[:, None, None]  # (kw, 1, ow)
    pos_h = base_h[None, None, :, None] + offset[:, :, :, :, 0]  # (n, G, kh, kw, oh, ow)
    pos_w = base_w[None, None, None, :] + offset[:, :, :, :, 1]
    flat = x.reshape(n, offset_group, c // offset_group, height * width)
    y0, x0 = jnp.floor(pos_h), jnp.floor(pos_w)
    cols = jnp.zeros((n, offset_group, c // offset_group) + pos_h.shape[2:], x.dtype)
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        yi, xi = y0 + dy, x0 + dx
        weight = (1 - jnp.abs(pos_h - yi)) * (1 - jnp.abs(pos_w - xi))
        valid = (yi >= 0) & (yi < height) & (xi >= 0) & (xi < width)
        index = (jnp.clip(yi, 0, height - 1) * width + jnp.clip(xi, 0, width - 1)).astype(jnp.int32)
        gathered = jnp.take_along_axis(flat, index.reshape(n, offset_group, 1, -1), axis=3)
        gathered = gathered.reshape(cols.shape)
        cols = cols + gathered * jnp.where(valid, weight, 0).astype(x.dtype)[:, :, None]
    cols = cols * mask[:, :, None].astype(x.dtype)
    cols = cols.reshape(n, group, c // group, kh, kw, oh, ow)
    weights = w.reshape(group, oc // group, c // group, kh, kw)
    y = jnp.einsum("ngcuvij,gocuv->ngoij", cols, weights, precision=dot_precision(cols, weights)).reshape(n, oc, oh, ow)
    return _add_bias(y, b).astype(x.dtype)


def conv_by_groups(x, w, b=None, *, auto_pad, group, kernel_shape=None, pads=None, strides=None, dilations=None):
    """ONNX Conv with ``group`` > 1 as a product batched over the groups; values as `conv`.

    XLA's SPMD partitioner (jax 0.10) all-gathers a grouped convolution with
    several channels per group when its channels are split on group
    boundaries (docs/known-issues.md). Written as per-channel patches (a
    depthwise extraction, which stays local under a channel split) and a
    ``dot_general`` whose batch axis is the group, every device computes its
    own groups: no collective. It holds ``prod(kernel)`` times the input in
    patches, so the sharded runtime uses it only where the channels are split.
    """
    kernel, strides, dilations = _defaults(x, kernel_shape or w.shape[2:], strides, dilations)
    padding = spatial_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads)
    n = x.ndim - 2
    patches = jax.lax.conv_general_dilated_patches(
        x, kernel, strides, padding, rhs_dilation=dilations,
        dimension_numbers=_dimension_numbers(n), precision=dot_precision(x),
    )  # [N, C * prod(kernel), out...], channel-major
    out_spatial = patches.shape[2:]
    taps = int(np.prod(kernel))
    batch, out_channels = x.shape[0], w.shape[0]
    patches = patches.reshape((batch, group, (x.shape[1] // group) * taps) + out_spatial)
    rhs = w.astype(x.dtype).reshape(group, out_channels // group, -1)
    y = jnp.einsum("ngk...,gok->ngo...", patches, rhs, precision=dot_precision(patches, rhs))
    y = y.reshape((batch, out_channels) + out_spatial)
    return _add_bias(y, b).astype(x.dtype)
