"""A 400 for too many pixels names the bound that refused the image: past PIL's own decompression-bomb
bound (twice ``Image.MAX_IMAGE_PIXELS``), under a --max-image-pixels set higher than it, the error
said "image has 200000000 pixels; at most 300000000 are accepted"."""

from __future__ import annotations

import base64

import pytest

from helios.frontend.images.decode import ImageLimits, decode_image_urls
from helios.frontend.images.errors import ImageRejected

from .test_hostile_images import png_declaring

PIL = pytest.importorskip("PIL.Image")


def test_an_image_past_pils_bound_is_refused_with_that_bound():
    bound = 2 * PIL.MAX_IMAGE_PIXELS
    url = "data:image/png;base64," + base64.b64encode(png_declaring(20_000, 10_000)).decode()
    with pytest.raises(ImageRejected, match=f"image has 200000000 pixels; at most {bound} are accepted"):
        decode_image_urls([url], ImageLimits(max_pixels=300_000_000))
    with pytest.raises(ImageRejected, match="image has 200000000 pixels; at most 1000 are accepted"):
        decode_image_urls([url], ImageLimits(max_pixels=1000))
