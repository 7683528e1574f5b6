"""An image's EXIF orientation is applied before it is prepared, as transformers' processor applies it
to an image it is given as a data: URL (its `fetch_images` -> `load_image`), and as vLLM does: a phone's
portrait photo, stored sideways with Orientation 6, reaches the model upright, on the patch grid of its
displayed shape, with the pixels the processor gives for that same URL."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest

from helios.frontend.images.decode import ImageLimits, decode_image_urls
from helios.frontend.images.preparation import PreparationParams, prepare_image

from .tiny_vl import MAX_PIXELS, MEAN, MIN_PIXELS, STD, hf_image_processor

PIL = pytest.importorskip("PIL.Image")
PARAMS = PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
ORIENTATION = 0x0112


def _tagged(fmt: str, orientation: int, mode: str = "RGB") -> bytes:
    """A 50x30 image of distinct pixels (so any turn or flip changes them) tagged with `orientation`."""
    rgb = np.random.default_rng(orientation).integers(0, 255, size=(30, 50, 3), dtype=np.uint8)
    image = PIL.fromarray(rgb).convert(mode)
    exif = image.getexif()
    exif[ORIENTATION] = orientation
    out = io.BytesIO()
    image.save(out, format=fmt, exif=exif, **({"lossless": True} if fmt == "WEBP" else {}))
    return out.getvalue()


@pytest.mark.parametrize("fmt, orientation, mode", [
    ("JPEG", 6, "RGB"), ("JPEG", 8, "RGB"), ("JPEG", 3, "RGB"), ("JPEG", 2, "L"), ("JPEG", 5, "RGB"),
    ("PNG", 6, "RGB"), ("PNG", 7, "RGB"), ("WEBP", 6, "RGB"), ("JPEG", 1, "RGB")])
def test_an_oriented_image_prepares_as_the_processor_prepares_its_url(fmt, orientation, mode):
    url = f"data:image/{fmt.lower()};base64," + base64.b64encode(_tagged(fmt, orientation, mode)).decode()
    (decoded,) = decode_image_urls([url], ImageLimits())
    assert decoded.image.size == ((30, 50) if orientation >= 5 else (50, 30))  # (width, height) as displayed
    ours = prepare_image(decoded.image, PARAMS, decoded.digest)
    reference = hf_image_processor()(images=[url], return_tensors="np")  # the URL itself, as a client sends it
    assert [1, ours.grid_h, ours.grid_w] == reference["image_grid_thw"][0].tolist()
    np.testing.assert_array_equal(ours.patches, reference["pixel_values"])
