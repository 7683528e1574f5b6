"""The default patch capacity holds every image the processor produces: the most whole merge units
max_pixels holds, or more where a thin image keeps one unit on its short side (scaled down, or
scaled up to min_pixels with both sides rounded up). A 1x150 image needed 100 patches of the tiny
checkpoints' processor, whose default capacity was 80 (max_pixels' share): a 400 for an image
transformers serves."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from helios.frontend.images.preparation import smart_size
from helios.ignition.preparation.vision_contract import ImageProcessorSettings, max_image_patches

from .tiny_vl import MAX_PIXELS, MIN_PIXELS

GREY = (0.5, 0.5, 0.5)


def recipe(patch: int, merge: int = 2):
    return SimpleNamespace(vision=SimpleNamespace(patch_size=patch, merge_size=merge))


def most_patches(patch: int, merge: int, min_pixels: int, max_pixels: int) -> tuple[int, tuple[int, int]]:
    """The most patches `smart_size` gives an image of sides up to 40 x 4,000 within the aspect bound."""
    best = (0, (0, 0))
    for height in range(1, 41):
        for width in range(height, min(200 * height, 4000) + 1):
            h, w = smart_size(height, width, patch * merge, min_pixels, max_pixels)
            best = max(best, (h * w // (patch * patch), (height, width)))
    return best


@pytest.mark.parametrize("patch, min_pixels, max_pixels", [
    (14, MIN_PIXELS, MAX_PIXELS),  # the tiny Qwen2.5-VL checkpoint
    (16, 32 * 32 * 4, 32 * 32 * 20),  # the tiny Qwen3-VL one
    (14, 56 * 56, 28 * 28 * 100),
])
def test_the_default_capacity_is_the_most_patches_any_image_gets(patch, min_pixels, max_pixels):
    capacity = max_image_patches(recipe(patch), ImageProcessorSettings(GREY, GREY, min_pixels, max_pixels))
    patches, _ = most_patches(patch, 2, min_pixels, max_pixels)
    assert capacity == patches > max_pixels // (patch * patch)
    assert capacity % 4 == 0


def test_a_thin_image_of_the_tiny_processor_fits():
    capacity = max_image_patches(recipe(14), ImageProcessorSettings(GREY, GREY, MIN_PIXELS, MAX_PIXELS))
    h, w = smart_size(1, 150, 28, MIN_PIXELS, MAX_PIXELS)
    assert h * w // 196 == 100 and capacity == 252


def test_realistic_processors_keep_max_pixels_share():
    """Qwen2.5-VL's published bounds (and the common 256..1280 units): the thin cases stay below
    max_pixels, so the capacity is max_pixels' share as before."""
    for min_pixels, max_pixels in ((3136, 12845056), (256 * 28 * 28, 1280 * 28 * 28)):
        settings = ImageProcessorSettings(GREY, GREY, min_pixels, max_pixels)
        assert max_image_patches(recipe(14), settings) == max_pixels // 196 // 4 * 4
