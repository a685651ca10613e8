"""Resize, Upsample, GridSample, AffineGrid against onnxruntime (and ONNX's reference for the newest versions)."""

import functools

import numpy as np
import pytest

import opcheck

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


def _scales(*values):
    return np.array(values, np.float32)


def _sizes(*values):
    return np.array(values, np.int64)


_EMPTY_ROI = np.array([], np.float32)


@pytest.mark.parametrize(
    "mode,ctm,extra",
    [
        ("nearest", "asymmetric", dict(nearest_mode="floor")),
        ("nearest", "half_pixel", dict(nearest_mode="round_prefer_ceil")),
        ("nearest", "align_corners", dict(nearest_mode="round_prefer_floor")),
        ("linear", "half_pixel", {}),
        ("linear", "pytorch_half_pixel", {}),
        ("linear", "align_corners", {}),
        ("linear", "asymmetric", {}),
        ("cubic", "half_pixel", dict(cubic_coeff_a=-0.5)),
        ("cubic", "asymmetric", dict(exclude_outside=1)),
    ],
)
@pytest.mark.parametrize("scales", [(1, 1, 2, 1.5), (1, 1, 0.6, 0.5)], ids=["up", "down"])
def test_resize_scales(mode, ctm, extra, scales):
    x = _f(1, 2, 6, 8)
    # align_corners with a scale whose output length is fractional (8 * 0.5 is whole, 6 * 0.6 is
    # not): ONNX's reference and node cases divide by scale * length, onnxruntime by the output size.
    oracle = "reference" if ctm == "align_corners" and scales[2] == 0.6 else "ort"
    check(
        "Resize", 13, [x, _EMPTY_ROI, _scales(*scales)], consts=(1, 2), mode=mode,
        coordinate_transformation_mode=ctm, oracle=oracle, rtol=1e-4, atol=1e-5, **extra,
    )


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [(2, 2, 9, 5), (2, 2, 3, 12)])
def test_resize_sizes(mode, sizes):
    check("Resize", 13, [_f(2, 2, 6, 8), _EMPTY_ROI, None, _sizes(*sizes)], consts=(1, 3), mode=mode, rtol=1e-4, atol=1e-5)


def test_resize_11_scales():
    check("Resize", 11, [_f(1, 2, 4, 6), _EMPTY_ROI, _scales(1, 1, 2, 0.5)], consts=(1, 2), mode="linear", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_with_axes(policy):
    check(
        "Resize", 18, [_f(1, 2, 6, 8), None, None, _sizes(9, 9)], consts=(3,), mode="linear", axes=[2, 3],
        keep_aspect_ratio_policy=policy, rtol=1e-4, atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias(mode):
    check(
        "Resize", 18, [_f(1, 1, 12, 10), None, _scales(1, 1, 0.4, 0.6)], consts=(2,), mode=mode, antialias=1,
        rtol=1e-4, atol=1e-5,
    )


def test_resize_tf_crop_and_resize():
    roi = np.array([0, 0, 0.2, 0.3, 1, 1, 0.9, 0.8], np.float32)
    check(
        "Resize", 13, [_f(1, 1, 6, 6), roi, None, _sizes(1, 1, 4, 5)], consts=(1, 3), mode="linear",
        coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=-1.0, rtol=1e-4, atol=1e-5,
    )


def test_resize_half_pixel_symmetric():
    check(
        "Resize", 19, [_f(1, 1, 4, 5), None, _scales(1, 1, 1.7, 0.7)], consts=(2,), mode="linear",
        coordinate_transformation_mode="half_pixel_symmetric", oracle="reference", rtol=1e-4, atol=1e-5,
    )


def test_resize_uint8_linear_rounds():
    x = RNG.integers(0, 255, (1, 1, 4, 4)).astype(np.uint8)
    check("Resize", 13, [x, _EMPTY_ROI, _scales(1, 1, 1.5, 1.5)], consts=(1, 2), mode="linear", rtol=0, atol=1)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [(1, 1, 2, 3), (1, 1, 0.5, 0.6)])
def test_resize_10(mode, scales):
    check("Resize", 10, [_f(1, 2, 4, 5), _scales(*scales)], consts=(1,), mode=mode, rtol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_9(mode):
    check("Upsample", 9, [_f(1, 2, 3, 4), _scales(1, 1, 2, 3)], consts=(1,), mode=mode, rtol=1e-5)


def test_upsample_7():
    check("Upsample", 7, [_f(1, 2, 3, 4)], scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")


@pytest.mark.parametrize(
    "mode,padding_mode,align_corners",
    [
        ("bilinear", "zeros", 0),
        ("bilinear", "border", 1),
        ("bilinear", "reflection", 0),
        ("nearest", "zeros", 1),
        ("nearest", "reflection", 1),
        ("bicubic", "zeros", 0),
        ("bicubic", "border", 1),
        ("bicubic", "reflection", 0),
    ],
)
def test_grid_sample_16(mode, padding_mode, align_corners):
    grid = (RNG.random((2, 5, 4, 2)) * 2.6 - 1.3).astype(np.float32)  # some points outside [-1, 1]
    check(
        "GridSample", 16, [_f(2, 3, 4, 6), grid], mode=mode, padding_mode=padding_mode,
        align_corners=align_corners, rtol=1e-4, atol=1e-5,
    )


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_grid_sample_20(mode):
    grid = (RNG.random((1, 4, 5, 2)) * 2.4 - 1.2).astype(np.float32)
    check("GridSample", 20, [_f(1, 2, 5, 6), grid], mode=mode, padding_mode="border", rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_20_volumetric(mode):
    grid = (RNG.random((1, 3, 4, 2, 3)) * 2.4 - 1.2).astype(np.float32)
    check("GridSample", 20, [_f(1, 2, 3, 4, 5), grid], mode=mode, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (1, 2, 3, 4, 5)])
def test_affine_grid(align_corners, size):
    theta = _f(size[0], len(size) - 2, len(size) - 1)
    check("AffineGrid", 20, [theta, np.array(size, np.int64)], consts=(1,), align_corners=align_corners)
