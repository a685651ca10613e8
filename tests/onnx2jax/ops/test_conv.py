"""Conv, ConvTranspose, Col2Im, DeformConv, CausalConvWithState against onnxruntime or ONNX's reference."""

import functools

import numpy as np
import pytest

import opcheck

RNG = np.random.default_rng(0)
_f = opcheck.normal_arrays(RNG)
# Static inputs (consts=) are Constant nodes; onnx2jax would trace float initializers.
check = functools.partial(opcheck.check, rtol=1e-5, atol=1e-5, count="at_least")


@pytest.mark.parametrize("opset", [1, 11, 22])
def test_conv_opsets(opset):
    oracle = "ort" if opset < 22 else "reference"
    check("Conv", opset, [_f(1, 3, 7, 7), _f(4, 3, 3, 3), _f(4)], pads=[1, 1, 1, 1], oracle=oracle, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    [
        ((2, 3, 9), (4, 3, 3), dict(strides=[2], pads=[1, 2])),
        ((1, 4, 10), (4, 2, 3), dict(group=2, dilations=[2])),
        ((1, 3, 8, 9), (5, 3, 3, 2), dict(strides=[2, 1], pads=[1, 0, 2, 1], dilations=[1, 2])),
        ((1, 6, 7, 7), (6, 1, 3, 3), dict(group=6, pads=[1, 1, 1, 1])),  # depthwise
        ((1, 4, 7, 8), (6, 2, 3, 3), dict(group=2, auto_pad="SAME_UPPER", strides=[2, 2])),
        ((1, 4, 7, 8), (6, 4, 2, 3), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
        ((1, 4, 7, 8), (6, 4, 3, 3), dict(auto_pad="VALID", strides=[2, 2])),
        ((1, 2, 5, 6, 7), (3, 2, 3, 3, 2), dict(pads=[1, 0, 1, 1, 0, 0], strides=[1, 2, 1])),
    ],
)
def test_conv(x_shape, w_shape, attrs):
    check("Conv", 11, [_f(*x_shape), _f(*w_shape), _f(w_shape[0])], rtol=1e-4, atol=1e-4, **attrs)


def test_conv_without_bias_and_kernel_shape_attribute():
    check("Conv", 11, [_f(1, 3, 6, 6), _f(2, 3, 3, 3)], kernel_shape=[3, 3], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "x_shape,w_shape,attrs",
    [
        ((1, 3, 5), (3, 2, 3), dict(strides=[2])),
        ((1, 3, 4, 5), (3, 2, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
        ((1, 4, 4, 4), (4, 3, 3, 3), dict(group=2, strides=[2, 1], dilations=[1, 2])),
        ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[3, 2], output_shape=[10, 8])),
        ((1, 2, 3, 3), (2, 2, 3, 3), dict(strides=[2, 2], auto_pad="SAME_UPPER")),
        ((1, 2, 3, 3), (2, 2, 4, 4), dict(strides=[2, 2], auto_pad="SAME_LOWER")),
        ((1, 2, 3, 4, 3), (2, 1, 2, 2, 2), dict(strides=[2, 1, 2], pads=[0, 1, 0, 1, 0, 1])),
    ],
)
def test_conv_transpose(x_shape, w_shape, attrs):
    channels_out = w_shape[1] * attrs.get("group", 1)
    check("ConvTranspose", 11, [_f(*x_shape), _f(*w_shape), _f(channels_out)], rtol=1e-4, atol=1e-4, **attrs)


@pytest.mark.parametrize("opset", [1, 22])
def test_conv_transpose_opsets(opset):
    oracle = "ort" if opset < 22 else "reference"
    check("ConvTranspose", opset, [_f(1, 2, 3, 3), _f(2, 3, 3, 3)], strides=[2, 2], oracle=oracle, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "image,block,attrs",
    [((5, 5), (2, 2), {}), ((6, 7), (3, 2), dict(strides=[2, 1], pads=[1, 0, 1, 1], dilations=[1, 2]))],
)
def test_col2im(image, block, attrs):
    # Column count from the im2col geometry of the (padded) image.
    n = len(image)
    strides = attrs.get("strides", [1] * n)
    dilations = attrs.get("dilations", [1] * n)
    pads = attrs.get("pads", [0] * 2 * n)
    blocks = 1
    for i in range(n):
        padded = image[i] + pads[i] + pads[i + n]
        blocks *= (padded - (dilations[i] * (block[i] - 1) + 1)) // strides[i] + 1
    x = _f(2, 3 * int(np.prod(block)), blocks)
    arrays = [x, np.array(image, np.int64), np.array(block, np.int64)]
    check("Col2Im", 18, arrays, consts=(1, 2), **attrs)


@pytest.mark.parametrize("with_mask", [False, True])
def test_deform_conv(with_mask):
    x, w = _f(1, 4, 5, 5), _f(2, 2, 3, 3)
    offset = _f(1, 2 * 2 * 9, 5, 5)
    mask = RNG.random((1, 2 * 9, 5, 5)).astype(np.float32) if with_mask else None
    arrays = [x, w, offset, _f(2), mask]
    check("DeformConv", 19, arrays, group=2, offset_group=2, pads=[1, 1, 1, 1], oracle="reference", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("past", [False, True])
def test_causal_conv_with_state(activation, past):
    arrays = [_f(2, 3, 5), _f(3, 1, 4), _f(3), _f(2, 3, 3) if past else None]
    check("CausalConvWithState", 27, arrays, n_out=2, activation=activation, oracle="reference")
