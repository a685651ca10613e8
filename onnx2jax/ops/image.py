"""ImageDecoder: an encoded image (JPEG, PNG, BMP, TIFF, WebP, PNM, JPEG 2000) -> [H, W, C] uint8.

XLA has no image codecs, and the decoded shape depends on the bytes, so the
encoded input is a value known while tracing (a graph input feeding it is a
compile-time constant, one compile per distinct image) and Pillow decodes it
on the host, as ONNX's reference does. Pillow is an optional extra
(``pip install -e '.[image]'`` from a clone, or ``pip install Pillow``), imported only when a model decodes an image.
"""

from __future__ import annotations

import io

import numpy as np

from onnx2jax.ops.registry import register


@register("ImageDecoder", 20, static_inputs=(0,))
def image_decoder(encoded, *, pixel_format):
    """The decoded image as [H, W, 3] (RGB or BGR) or [H, W, 1] (Grayscale) uint8."""
    try:
        import PIL.Image
    except ImportError as e:
        raise ImportError(
            "ImageDecoder needs Pillow: pip install Pillow (or pip install -e '.[image]' from a clone of onnx2jax)"
        ) from e
    image = PIL.Image.open(io.BytesIO(np.asarray(encoded, np.uint8).tobytes()))
    if pixel_format == "Grayscale":
        return np.asarray(image.convert("L"))[:, :, None]
    if pixel_format not in ("RGB", "BGR"):
        raise ValueError(f"ImageDecoder: unknown pixel_format {pixel_format!r}")
    decoded = np.asarray(image.convert("RGB"))
    return decoded[:, :, ::-1] if pixel_format == "BGR" else decoded
