"""Pooling: MaxPool, AveragePool, LpPool, Global*Pool, MaxUnpool, MaxRoiPool, RoiAlign."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.conv import spatial_pads
from onnx2jax.ops.registry import register


def _window(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode):
    """Resolves pooling geometry: (kernel, strides, dilations, pads, extra_end).

    ``pads`` are the explicit (or SAME) pads; ``extra_end`` is what ceil_mode
    adds after them so that the last window fits. Those extra cells never count
    as padding. Worked example: in=5, k=2, s=2, no pads, ceil_mode: out =
    ceil((5 - 2) / 2) + 1 = 3, and the last window starts at 4 < 5 so it stays;
    the windows need (3 - 1) * 2 + 2 = 6 cells, so extra_end = 1.
    """
    n = x.ndim - 2
    kernel = tuple(int(k) for k in kernel_shape)
    strides = tuple(int(s) for s in strides) if strides else (1,) * n
    dilations = tuple(int(d) for d in dilations) if dilations else (1,) * n
    pads = spatial_pads(auto_pad, x.shape[2:], kernel, strides, dilations, pads)
    extra = []
    for size, k, s, d, (lo, hi) in zip(x.shape[2:], kernel, strides, dilations, pads):
        span = (k - 1) * d + 1
        if ceil_mode:
            out = -(-(size + lo + hi - span) // s) + 1
            if (out - 1) * s >= size + lo:
                out -= 1
        else:
            out = (size + lo + hi - span) // s + 1
        extra.append(max(0, (out - 1) * s + span - (size + lo + hi)))
    return kernel, strides, dilations, pads, tuple(extra)


def _reduce(x, init, op, kernel, strides, dilations, padding):
    # A numpy init value: jax recognises (max, -inf) and (add, 0) as its differentiable
    # monoid reductions only when the init value is concrete, which jnp.array under a trace is not.
    return jax.lax.reduce_window(
        x,
        np.array(init, x.dtype),
        op,
        (1, 1) + kernel,
        (1, 1) + strides,
        [(0, 0), (0, 0)] + list(padding),
        window_dilation=(1, 1) + dilations,
    )


def _lowest(dtype):
    return -jnp.inf if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype).min


def _max_indices(x, kernel, strides, dilations, padding, storage_order):
    """Flat input index of each window's first maximum, as ONNX's MaxPool Indices output."""
    n_sp = x.ndim - 2
    spatial = x.shape[2:]
    padded_shape = [s + lo + hi for s, (lo, hi) in zip(spatial, padding)]
    outs = [(p - ((k - 1) * d + 1)) // s + 1 for p, k, s, d in zip(padded_shape, kernel, strides, dilations)]
    # Static gather plan: for each output cell and kernel offset, the padded coordinate.
    coords = []
    for axis in range(n_sp):
        o = np.arange(outs[axis])[:, None] * strides[axis] + np.arange(kernel[axis])[None, :] * dilations[axis]
        coords.append(o)  # (out, k)
    xp = jnp.pad(x, [(0, 0), (0, 0)] + list(padding), constant_values=_lowest(x.dtype))
    grids = np.meshgrid(*[np.arange(o) for o in outs], *[np.arange(k) for k in kernel], indexing="ij")
    idx = [coords[a][grids[a], grids[n_sp + a]] for a in range(n_sp)]  # each (out..., k...)
    patches = xp[(slice(None), slice(None)) + tuple(idx)]
    flat = patches.reshape(x.shape[:2] + tuple(outs) + (-1,))
    best = jnp.argmax(flat, axis=-1)
    # Map the winning offset back to unpadded input coordinates.
    unpadded = [idx[a].reshape(tuple(outs) + (-1,)) - padding[a][0] for a in range(n_sp)]
    if storage_order == 0:
        strides_flat = [int(np.prod(spatial[a + 1 :])) for a in range(n_sp)]
    else:
        strides_flat = [int(np.prod(spatial[:a])) for a in range(n_sp)]
    spatial_index = sum(jnp.asarray(u * st) for u, st in zip(unpadded, strides_flat))  # (out..., K)
    chosen = jnp.take_along_axis(
        jnp.broadcast_to(spatial_index, flat.shape), best[..., None], axis=-1
    )[..., 0]
    nc = (jnp.arange(x.shape[0])[:, None] * x.shape[1] + jnp.arange(x.shape[1])[None, :]) * int(np.prod(spatial))
    return (chosen + nc.reshape(nc.shape + (1,) * n_sp)).astype(jnp.int64)


def _max_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order, want_indices):
    kernel, strides, dilations, pads, extra = _window(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padding = [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    y = _reduce(x, _lowest(x.dtype), jax.lax.max, kernel, strides, dilations, padding)
    if not want_indices:
        return y
    return y, _max_indices(x, kernel, strides, dilations, padding, storage_order)


@register("MaxPool", 1)
def max_pool_1(x, *, kernel_shape, auto_pad, pads=None, strides=None):
    return _max_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, 0, False)


@register("MaxPool", 8, 10, 11, 12, 22, context=True)
def max_pool(ctx, x, *, kernel_shape, auto_pad, storage_order, ceil_mode=0, pads=None, strides=None, dilations=None):
    return _max_pool(
        x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, storage_order, ctx.output_count > 1
    )


def _average_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad):
    kernel, strides, dilations, pads, extra = _window(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padding = [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    total = _reduce(x, 0, jax.lax.add, kernel, strides, dilations, padding)
    # Divisor: how many cells of each window are real input (or, with
    # count_include_pad, input or explicit padding; ceil_mode's extra never counts).
    # The divisor is static: computed eagerly, it becomes a constant instead of
    # something XLA constant-folds slowly.
    with jax.ensure_compile_time_eval():
        if count_include_pad:
            ones = jnp.ones((1, 1) + tuple(s + lo + hi for s, (lo, hi) in zip(x.shape[2:], pads)), x.dtype)
            count_padding = [(0, e) for e in extra]
        else:
            ones = jnp.ones((1, 1) + tuple(x.shape[2:]), x.dtype)
            count_padding = padding
        count = np.asarray(_reduce(ones, 0, jax.lax.add, kernel, strides, dilations, count_padding))
    return (total / count).astype(x.dtype)


@register("AveragePool", 1)
def average_pool_1(x, *, kernel_shape, auto_pad, pads=None, strides=None):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, 0)


@register("AveragePool", 7)
def average_pool_7(x, *, kernel_shape, auto_pad, count_include_pad, pads=None, strides=None):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, count_include_pad)


@register("AveragePool", 10, 11)
def average_pool_10(x, *, kernel_shape, auto_pad, count_include_pad, ceil_mode, pads=None, strides=None):
    return _average_pool(x, kernel_shape, strides, None, pads, auto_pad, ceil_mode, count_include_pad)


@register("AveragePool", 19, 22)
def average_pool_19(
    x, *, kernel_shape, auto_pad, count_include_pad, ceil_mode, pads=None, strides=None, dilations=None
):
    return _average_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, count_include_pad)


def _lp_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, p):
    kernel, strides, dilations, pads, extra = _window(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode)
    padding = [(lo, hi + e) for (lo, hi), e in zip(pads, extra)]
    total = _reduce(jnp.abs(x) ** p, 0, jax.lax.add, kernel, strides, dilations, padding)
    return (total ** (1.0 / p)).astype(x.dtype)


@register("LpPool", 1, 2, 11)
def lp_pool_2(x, *, kernel_shape, auto_pad, p, pads=None, strides=None):
    return _lp_pool(x, kernel_shape, strides, None, pads, auto_pad, 0, p)


@register("LpPool", 18, 22)
def lp_pool_18(x, *, kernel_shape, auto_pad, p, ceil_mode, pads=None, strides=None, dilations=None):
    return _lp_pool(x, kernel_shape, strides, dilations, pads, auto_pad, ceil_mode, p)


@register("GlobalAveragePool", 1, 22)
def global_average_pool(x):
    return jnp.mean(x, axis=tuple(range(2, x.ndim)), keepdims=True).astype(x.dtype)


@register("GlobalMaxPool", 1, 22)
def global_max_pool(x):
    return jnp.max(x, axis=tuple(range(2, x.ndim)), keepdims=True)


@register("GlobalLpPool", 1, 2, 22)
def global_lp_pool(x, *, p):
    total = jnp.sum(jnp.abs(x) ** p, axis=tuple(range(2, x.ndim)), keepdims=True)
    return (total ** (1.0 / p)).astype(x.dtype)


@register("MaxUnpool", 9, 11, 22, static_inputs=(2,))
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    n = x.ndim - 2
    strides = tuple(int(s) for s in strides) if strides else (1,) * n
    pads = [int(p) for p in pads] if pads else [0] * (2 * n)
    spatial = tuple(
        (size - 1) * s + k - pads[i] - pads[i + n]
        for i, (size, s, k) in enumerate(zip(x.shape[2:], strides, kernel_shape))
    )
    default_shape = tuple(x.shape[:2]) + spatial
    out_shape = default_shape if output_shape is None else tuple(int(v) for v in np.asarray(output_shape))
    # Indices are flat over the unpadded pooling input (the default shape); an
    # explicit output_shape only enlarges the canvas they are placed on.
    indices = indices.reshape(-1)
    if out_shape != default_shape:
        coords = jnp.unravel_index(indices, default_shape)
        indices = jnp.ravel_multi_index(coords, out_shape, mode="clip")
    flat = jnp.zeros(int(np.prod(out_shape)), x.dtype)
    flat = flat.at[indices].set(x.reshape(-1))
    return flat.reshape(out_shape)


@register("MaxRoiPool", 1, 22)
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale):
    # Caffe's RoI max pooling: each RoI [batch, x1, y1, x2, y2] (rounded after
    # scaling) is split into a ph x pw grid of bins, each reduced by max.
    ph, pw = (int(v) for v in pooled_shape)
    height, width = x.shape[2], x.shape[3]

    def one(roi):
        batch = roi[0].astype(jnp.int32)
        x1, y1, x2, y2 = (jnp.round(roi[i] * spatial_scale).astype(jnp.int32) for i in range(1, 5))
        roi_h = jnp.maximum(y2 - y1 + 1, 1)
        roi_w = jnp.maximum(x2 - x1 + 1, 1)
        bin_h = roi_h.astype(x.dtype) / ph
        bin_w = roi_w.astype(x.dtype) / pw
        image = x[batch]  # (C, H, W)
        hs = jnp.arange(height)
        ws = jnp.arange(width)
        rows = []
        for i in range(ph):
            hstart = jnp.clip(jnp.floor(i * bin_h).astype(jnp.int32) + y1, 0, height)
            hend = jnp.clip(jnp.ceil((i + 1) * bin_h).astype(jnp.int32) + y1, 0, height)
            cols = []
            for j in range(pw):
                wstart = jnp.clip(jnp.floor(j * bin_w).astype(jnp.int32) + x1, 0, width)
                wend = jnp.clip(jnp.ceil((j + 1) * bin_w).astype(jnp.int32) + x1, 0, width)
                mask = ((hs >= hstart) & (hs < hend))[:, None] & ((ws >= wstart) & (ws < wend))[None, :]
                value = jnp.max(jnp.where(mask, image, -jnp.inf), axis=(1, 2))
                empty = (hend <= hstart) | (wend <= wstart)
                cols.append(jnp.where(empty, jnp.zeros_like(value), value))
            rows.append(jnp.stack(cols, axis=-1))
        return jnp.stack(rows, axis=-2)

    return jax.vmap(one)(rois).astype(x.dtype)


def _roi_align(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio, spatial_scale, half_pixel):
    # Each RoI's bin is sampled on a grid of gh x gw points (sampling_ratio, or
    # ceil(roi size / output size), which depends on the RoI's data: a loop with
    # a data-dependent trip count). Each sample is bilinear, following
    # onnxruntime's RoiAlign (samples beyond one pixel outside the map are 0).
    height, width = x.shape[2], x.shape[3]
    ph, pw = int(output_height), int(output_width)
    dtype = x.dtype
    offset = 0.5 if half_pixel else 0.0

    def one(roi, batch):
        image = jnp.take(x, batch, axis=0)  # (C, H, W)
        start_w, start_h, end_w, end_h = (roi[i] * spatial_scale - offset for i in range(4))
        roi_w, roi_h = end_w - start_w, end_h - start_h
        if not half_pixel:
            roi_w, roi_h = jnp.maximum(roi_w, 1.0), jnp.maximum(roi_h, 1.0)
        bin_h, bin_w = roi_h / ph, roi_w / pw
        if sampling_ratio > 0:
            grid_h = grid_w = jnp.asarray(int(sampling_ratio), jnp.int32)
        else:
            grid_h = jnp.ceil(roi_h / ph).astype(jnp.int32)
            grid_w = jnp.ceil(roi_w / pw).astype(jnp.int32)
        samples = grid_h * grid_w
        rows = jnp.arange(ph, dtype=dtype)[:, None]
        cols = jnp.arange(pw, dtype=dtype)[None, :]

        def sample(k):
            iy = (k // jnp.maximum(grid_w, 1)).astype(dtype)
            ix = (k % jnp.maximum(grid_w, 1)).astype(dtype)
            y = start_h + rows * bin_h + (iy + 0.5) * bin_h / grid_h.astype(dtype)
            xx = start_w + cols * bin_w + (ix + 0.5) * bin_w / grid_w.astype(dtype)
            y, xx = jnp.broadcast_arrays(y, xx)
            outside = (y < -1.0) | (y > height) | (xx < -1.0) | (xx > width)
            y, xx = jnp.maximum(y, 0), jnp.maximum(xx, 0)
            y_low, x_low = y.astype(jnp.int32), xx.astype(jnp.int32)
            y_edge, x_edge = y_low >= height - 1, x_low >= width - 1
            y_low = jnp.where(y_edge, height - 1, y_low)
            x_low = jnp.where(x_edge, width - 1, x_low)
            y_high = jnp.where(y_edge, height - 1, y_low + 1)
            x_high = jnp.where(x_edge, width - 1, x_low + 1)
            ly = jnp.where(y_edge, 0, y - y_low)
            lx = jnp.where(x_edge, 0, xx - x_low)
            hy, hx = 1 - ly, 1 - lx
            keep = jnp.where(outside, 0, 1).astype(dtype)
            terms = [
                (hy * hx * keep) * image[:, y_low, x_low],
                (hy * lx * keep) * image[:, y_low, x_high],
                (ly * hx * keep) * image[:, y_high, x_low],
                (ly * lx * keep) * image[:, y_high, x_high],
            ]
            if mode == "avg":
                return terms[0] + terms[1] + terms[2] + terms[3]
            return jnp.maximum(jnp.maximum(terms[0], terms[1]), jnp.maximum(terms[2], terms[3]))

        channels = x.shape[1]
        if mode == "avg":
            total = jax.lax.fori_loop(0, samples, lambda k, acc: acc + sample(k), jnp.zeros((channels, ph, pw), dtype))
            return total / jnp.maximum(samples, 1).astype(dtype)
        if mode != "max":
            raise ValueError(f"RoiAlign: unknown mode {mode!r}")
        best = jax.lax.fori_loop(
            0, samples, lambda k, acc: jnp.maximum(acc, sample(k)), jnp.full((channels, ph, pw), -jnp.inf, dtype)
        )
        return jnp.where(samples > 0, best, jnp.zeros_like(best))

    return jax.vmap(one)(rois.astype(dtype), batch_indices.astype(jnp.int32)).astype(x.dtype)


@register("RoiAlign", 10)
def roi_align_10(x, rois, batch_indices, *, mode, output_height, output_width, sampling_ratio, spatial_scale):
    # Opset 10 predates coordinate_transformation_mode: it behaves as output_half_pixel.
    return _roi_align(
        x, rois, batch_indices, mode=mode, output_height=output_height, output_width=output_width,
        sampling_ratio=sampling_ratio, spatial_scale=spatial_scale, half_pixel=False,
    )


@register("RoiAlign", 16, 22)
def roi_align(
    x, rois, batch_indices, *, coordinate_transformation_mode, mode, output_height, output_width,
    sampling_ratio, spatial_scale,
):
    return _roi_align(
        x, rois, batch_indices, mode=mode, output_height=output_height, output_width=output_width,
        sampling_ratio=sampling_ratio, spatial_scale=spatial_scale,
        half_pixel=coordinate_transformation_mode == "half_pixel",
    )
