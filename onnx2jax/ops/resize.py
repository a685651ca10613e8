"""Resampling: Resize, Upsample, GridSample, AffineGrid.

Resize is separable: every resized axis is one gather of ``n`` neighbour taps
followed by a weighted sum. Which taps and which weights depend only on the
(static) shapes, scales and roi, so they are computed once in numpy at trace
time, following ONNX's reference implementation step by step.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from onnx2jax.ops.registry import register
from onnx2jax.numerics import dot_precision

# --- tap weights, per output position (numpy, static) ------------------------


def _nearest_weights(ratio, scale, nearest_mode):
    if float(ratio).is_integer():
        return np.array([0.0, 1.0])
    if nearest_mode == "round_prefer_floor":
        return np.array([ratio <= 0.5, ratio > 0.5], np.float64)
    if nearest_mode == "round_prefer_ceil":
        return np.array([ratio < 0.5, ratio >= 0.5], np.float64)
    if nearest_mode == "floor":
        return np.array([1.0, 0.0])
    if nearest_mode == "ceil":
        return np.array([0.0, 1.0])
    raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r}")


def _linear_weights(ratio, scale, antialias):
    if not antialias:
        return np.array([1 - ratio, ratio])
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    args = (np.arange(start, 2 - start) - ratio) * scale
    weights = np.clip(1 - np.abs(args), 0, 1)
    return weights / weights.sum()


def _cubic_weights(ratio, scale, antialias, a):
    if not antialias:
        r = ratio
        return np.array(
            [
                ((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                ((a + 2) * r - (a + 3)) * r * r + 1,
                ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                ((a * ((1 - r) + 1) - 5 * a) * ((1 - r) + 1) + 8 * a) * ((1 - r) + 1) - 4 * a,
            ]
        )
    scale = min(scale, 1.0)

    def kernel(x):
        x = abs(x)
        if x <= 1:
            return (a + 2) * x**3 - (a + 3) * x**2 + 1
        if x < 2:
            return a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a
        return 0.0

    start = int(np.floor(-2 / scale) + 1)
    weights = np.array([kernel(scale * (i - ratio)) for i in range(start, 2 - start)])
    return weights / weights.sum()


def _source_coordinates(mode, out_size, in_size, scale, roi):
    """Output index -> fractional input coordinate, for each coordinate_transformation_mode."""
    y = np.arange(out_size, dtype=np.float64)
    length = scale * in_size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_size) if length == 1 else y * (in_size - 1) / (length - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        if length == 1:
            x = np.full(out_size, (roi[1] - roi[0]) * (in_size - 1) / 2)
        else:
            x = y * (roi[1] - roi[0]) * (in_size - 1) / (length - 1)
        x = x + roi[0] * (in_size - 1)
        outside = (x < 0) | (x > in_size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_size / 2 * (1 - out_size / length)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")
    return x, outside


def _axis_plan(in_size, out_size, scale, roi, weights_of, coordinate_mode, exclude_outside):
    """(indices, weights, outside) for one axis: each output reads ``n`` clamped input taps.

    Mirrors onnx.reference's ``_interpolate_1d_along_axis``: with ``n`` taps the
    neighbours are the ``n`` inputs nearest to x (ties to the lower index), on an
    input padded by edge replication.
    """
    x, outside = _source_coordinates(coordinate_mode, out_size, in_size, scale, roi)
    x_int = np.floor(x)
    ratios = np.where(x == x_int, 1.0, x - x_int)
    weights = np.stack([weights_of(float(r), scale) for r in ratios]) if out_size else np.zeros((0, 2))
    n = weights.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    base = np.floor(xp)
    frac = xp - base
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    taps = (base + offset).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        weights = np.where((taps < 0) | (taps >= in_size), 0.0, weights)
        total = weights.sum(axis=-1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    return np.clip(taps, 0, in_size - 1), weights, outside


def _apply_axis(x, axis, taps, weights, outside, extrapolation_value, nearest):
    if nearest:
        source = taps[np.arange(len(taps)), np.argmax(weights, axis=-1)]
        y = jnp.take(x, jnp.asarray(source), axis=axis)
    else:
        gathered = jnp.take(x, jnp.asarray(taps.reshape(-1)), axis=axis)
        shape = x.shape[:axis] + taps.shape + x.shape[axis + 1 :]
        gathered = gathered.reshape(shape)
        w = weights.reshape((1,) * axis + weights.shape + (1,) * (x.ndim - axis - 1))
        y = jnp.sum(gathered * jnp.asarray(w, x.dtype), axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (-1,) + (1,) * (x.ndim - axis - 1))
        y = jnp.where(jnp.asarray(mask), jnp.asarray(extrapolation_value, y.dtype), y)
    return y


def _cast_back(y, dtype):
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return jnp.clip(jnp.round(y), info.min, info.max).astype(dtype)
    return y.astype(dtype)


def _resize(
    x,
    *,
    scales=None,
    sizes=None,
    roi=None,
    axes=None,
    mode="nearest",
    coordinate_transformation_mode="half_pixel",
    nearest_mode="round_prefer_floor",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    antialias=0,
    keep_aspect_ratio_policy="stretch",
):
    rank = x.ndim
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
    if scales is not None and np.asarray(scales).size == 0:
        scales = None
    if sizes is not None and np.asarray(sizes).size == 0:
        sizes = None
    if roi is not None and np.asarray(roi).size == 0:
        roi = None
    full_scales = [1.0] * rank
    out_sizes = list(x.shape)
    if roi is not None:
        roi = np.asarray(roi, np.float64)
        full_roi = [0.0] * rank + [1.0] * rank
        for i, a in enumerate(axes):
            full_roi[a], full_roi[rank + a] = roi[i], roi[len(axes) + i]
        roi = full_roi
    if sizes is not None:
        sizes = [int(s) for s in np.asarray(sizes)]
        for i, a in enumerate(axes):
            full_scales[a] = sizes[i] / x.shape[a]
            out_sizes[a] = sizes[i]
        if keep_aspect_ratio_policy != "stretch":
            pick = min if keep_aspect_ratio_policy == "not_larger" else max
            if keep_aspect_ratio_policy not in ("not_larger", "not_smaller"):
                raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}")
            scale = pick(full_scales[a] for a in axes)
            for a in axes:
                full_scales[a] = scale
                out_sizes[a] = int(scale * x.shape[a] + 0.5)
    elif scales is not None:
        scales = [float(s) for s in np.asarray(scales)]
        for i, a in enumerate(axes):
            full_scales[a] = scales[i]
            out_sizes[a] = int(np.float64(scales[i]) * x.shape[a])
    else:
        raise ValueError("Resize needs scales or sizes")

    if mode == "nearest":
        weights_of = lambda r, s: _nearest_weights(r, s, nearest_mode)  # noqa: E731
    elif mode == "linear":
        weights_of = lambda r, s: _linear_weights(r, s, antialias)  # noqa: E731
    elif mode == "cubic":
        weights_of = lambda r, s: _cubic_weights(r, s, antialias, cubic_coeff_a)  # noqa: E731
    else:
        raise ValueError(f"Resize: unknown mode {mode!r}")

    nearest = mode == "nearest"
    y = x if nearest or jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)
    for a in axes:
        axis_roi = None if roi is None else (roi[a], roi[a + rank])
        if (
            np.isclose(full_scales[a], 1.0)
            and out_sizes[a] == x.shape[a]
            and (axis_roi is None or (np.isclose(axis_roi[0], 0.0) and np.isclose(axis_roi[1], 1.0)))
        ):
            continue
        taps, weights, outside = _axis_plan(
            x.shape[a], out_sizes[a], full_scales[a], axis_roi, weights_of,
            coordinate_transformation_mode, exclude_outside,
        )
        y = _apply_axis(y, a, taps, weights, outside, extrapolation_value, nearest)
    return _cast_back(y, x.dtype)


@register("Resize", 11, 13, static_inputs=(1, 2, 3))
def resize_11(
    x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode, cubic_coeff_a,
    exclude_outside, extrapolation_value, mode, nearest_mode,
):
    return _resize(
        x, roi=roi, scales=scales, sizes=sizes, mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
    )


@register("Resize", 18, 19, static_inputs=(1, 2, 3))
def resize_18(
    x, roi=None, scales=None, sizes=None, *, antialias, coordinate_transformation_mode, cubic_coeff_a,
    exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode, nearest_mode, axes=None,
):
    return _resize(
        x, roi=roi, scales=scales, sizes=sizes, axes=axes, mode=mode,
        coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
        antialias=antialias, keep_aspect_ratio_policy=keep_aspect_ratio_policy,
    )


def _upsample(x, scales, mode):
    """Opset 7-10 Upsample / Resize-10: asymmetric coordinates; nearest floors when
    enlarging and ceils when shrinking (onnxruntime's "simple" nearest mode)."""
    scales = [float(s) for s in np.asarray(scales)]
    if mode == "nearest":
        y = x
        for a, s in enumerate(scales):
            out = int(np.float64(s) * x.shape[a])
            if out == x.shape[a] and s == 1.0:
                continue
            coord = np.arange(out) / s
            source = np.ceil(coord) if s < 1 else np.floor(coord)
            source = np.clip(source.astype(np.int64), 0, x.shape[a] - 1)
            y = jnp.take(y, jnp.asarray(source), axis=a)
        return y
    if mode in ("linear", "bilinear"):
        return _resize(x, scales=scales, mode="linear", coordinate_transformation_mode="asymmetric")
    raise ValueError(f"Upsample: unknown mode {mode!r}")


@register("Resize", 10, static_inputs=(1,))
def resize_10(x, scales, *, mode):
    return _upsample(x, scales, mode)


@register("Upsample", 7)
def upsample_7(x, *, scales, mode):
    return _upsample(x, scales, mode)


@register("Upsample", 9, 10, static_inputs=(1,))
def upsample_9(x, scales, *, mode):
    return _upsample(x, scales, mode)


# --- GridSample / AffineGrid --------------------------------------------------


def _reflect(x, lo, hi):
    """Reflects x by the nearer border until it lies in [lo, hi] (ONNX's GridSample rule)."""
    span = hi - lo
    below = x < lo
    dx = jnp.where(below, lo - x, x - hi)
    n = jnp.floor(dx / span)
    r = dx - n * span
    even = jnp.mod(n, 2) == 0
    from_below = jnp.where(even, lo + r, hi - r)
    from_above = jnp.where(even, hi - r, lo + r)
    return jnp.where(below, from_below, jnp.where(x > hi, from_above, x))


def _cubic_kernel(t, a=-0.75):
    """Keys cubic weights for taps at -1, 0, 1, 2 around a fractional offset t in [0, 1)."""
    return [
        ((a * (t + 1) - 5 * a) * (t + 1) + 8 * a) * (t + 1) - 4 * a,
        ((a + 2) * t - (a + 3)) * t * t + 1,
        ((a + 2) * (1 - t) - (a + 3)) * (1 - t) * (1 - t) + 1,
        ((a * (2 - t) - 5 * a) * (2 - t) + 8 * a) * (2 - t) - 4 * a,
    ]


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    dims = x.shape[2:]
    nd = len(dims)
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32
    coords = []
    for i, size in enumerate(dims):
        g = grid[..., nd - 1 - i].astype(jnp.float32)  # grid's last axis lists x (W) first
        if align_corners:
            c = (g + 1) / 2.0 * (size - 1)
            lo, hi = 0.0, size - 1.0
        else:
            c = ((g + 1) * size - 1) / 2.0
            lo, hi = -0.5, size - 0.5
        coords.append((c, lo, hi))

    def fix(c, lo, hi, size):
        outside = (c < lo) | (c > hi)
        if padding_mode == "border":
            return jnp.where(outside, jnp.clip(c, 0, size - 1), c)
        if padding_mode == "reflection":
            return jnp.where(outside, _reflect(c, lo, hi), c)
        return c

    def tap(index, lo, hi, size):
        """An integer tap -> (clamped gather index, in-bounds weight factor)."""
        if padding_mode == "zeros":
            valid = (index >= 0) & (index < size)
            return jnp.clip(index, 0, size - 1), valid
        if padding_mode == "border":
            return jnp.clip(index, 0, size - 1), None
        reflected = _reflect(index.astype(jnp.float32), lo, hi)
        return jnp.clip(jnp.trunc(reflected).astype(jnp.int32), 0, size - 1), None

    per_axis = []  # for each axis: list of (index, weight, valid)
    for (c, lo, hi), size in zip(coords, dims):
        if mode == "nearest":
            c = fix(jnp.round(c), lo, hi, size)  # jnp.round rounds half to even, as np.rint
            index, valid = tap(c.astype(jnp.int32), lo, hi, size)
            per_axis.append([(index, None, valid)])
            continue
        if mode not in ("cubic", "bicubic"):
            c = fix(c, lo, hi, size)
        base = jnp.floor(c)
        t = c - base
        base = base.astype(jnp.int32)
        if mode in ("linear", "bilinear"):
            offsets, weights = (0, 1), (1 - t, t)
        elif mode in ("cubic", "bicubic"):
            offsets, weights = (-1, 0, 1, 2), _cubic_kernel(t)
        else:
            raise ValueError(f"GridSample: unknown mode {mode!r}")
        taps = []
        for o, w in zip(offsets, weights):
            index, valid = tap(base + o, lo, hi, size)
            taps.append((index, w.astype(dtype), valid))
        per_axis.append(taps)

    def sample(image, indices):  # image (C, *dims), indices per axis (out...)
        return image[(slice(None),) + tuple(indices)]

    y = None
    for combo in itertools.product(*per_axis):
        indices = [t[0] for t in combo]
        values = jax.vmap(sample)(x.astype(dtype), indices)  # (N, C, out...)
        weight = None
        for _, w, valid in combo:
            factor = w
            if valid is not None:
                v = valid.astype(dtype)
                factor = v if factor is None else factor * v
            if factor is not None:
                weight = factor if weight is None else weight * factor
        term = values if weight is None else values * weight[:, None]
        y = term if y is None else y + term
    return y.astype(x.dtype)


@register("GridSample", 16)
def grid_sample_16(x, grid, *, align_corners, mode, padding_mode):
    # Opset 16 is 2-D only, with the modes spelled bilinear / bicubic.
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@register("GridSample", 20, 22)
def grid_sample(x, grid, *, align_corners, mode, padding_mode):
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


@register("AffineGrid", 20, static_inputs=(1,))
def affine_grid(theta, size, *, align_corners):
    spatial = [int(s) for s in np.asarray(size)[2:]]
    axes = []
    for n in spatial:
        if align_corners:
            axes.append(np.linspace(-1.0, 1.0, n) if n > 1 else np.array([-1.0]))
        else:
            axes.append((np.arange(n) * 2.0 + 1) / n - 1)
    mesh = np.meshgrid(*axes, indexing="ij")  # in D, H, W order
    # Homogeneous base coordinates ordered (x, y[, z], 1), i.e. W first.
    base = np.stack([m for m in reversed(mesh)] + [np.ones(spatial)], axis=-1)
    flat = jnp.asarray(base.reshape(-1, len(spatial) + 1), theta.dtype)
    grid = jnp.einsum("nij,pj->npi", theta, flat, precision=dot_precision(theta, flat))
    return grid.reshape((theta.shape[0], *spatial, len(spatial))).astype(theta.dtype)
