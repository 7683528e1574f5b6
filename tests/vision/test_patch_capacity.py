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


def least_patches(patch: int, merge: int, min_pixels: int, max_pixels: int) -> int:
    """The fewest patches `smart_size` gives an image of sides up to 60 x 1,200 within the aspect bound."""
    sizes = ((height, width) for height in range(1, 61) for width in range(height, min(200 * height, 1200) + 1))
    return min(h * w // (patch * patch) for height, width in sizes
               for h, w in (smart_size(height, width, patch * merge, min_pixels, max_pixels),))


@pytest.mark.parametrize("patch, min_pixels, max_pixels", [
    (14, MIN_PIXELS, MAX_PIXELS),
    (14, 3136, 3136),  # every image scaled to one size: the scaled-down floor decides
    (14, 28 * 28 * 36, 28 * 28 * 40),
])
def test_the_least_patches_bound_no_image_of_the_processor_goes_below(patch, min_pixels, max_pixels):
    from helios.ignition.vision_plan import min_image_patches

    bound = min_image_patches(recipe(patch).vision, ImageProcessorSettings(GREY, GREY, min_pixels, max_pixels))
    assert 0 < bound <= least_patches(patch, 2, min_pixels, max_pixels)


def test_patch_capacities_below_the_smallest_image_are_refused_before_capture(tmp_path, capsys, monkeypatch):
    """A capacity smaller than the processor's smallest image (min_pixels: 16 patches) was prepared: its
    VISION program encodes no image, and a core of such capacities alone refused every image at serve
    time ("needs more patches than the prepared capacities")."""
    import helios.ignition.export as export
    from helios.cli.main import main
    from helios.core.keys import SigningKey, write_key_pair

    from .vl_checkpoint import NAMESPACE, write_vl_checkpoint

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the patch capacities were checked")

    monkeypatch.setattr(export, "capture_all", no_capture)
    write_vl_checkpoint(tmp_path / "checkpoint")
    key = tmp_path / "publisher.key"
    write_key_pair(key, SigningKey.generate(), [NAMESPACE])
    output = tmp_path / "out" / "model.core"
    output.parent.mkdir()
    code = main(["prepare", str(tmp_path / "checkpoint"), "-o", str(output), "--key", str(key), "--namespace",
                 NAMESPACE, "--context-tokens", "256", "--decode-batches", "1", "--patch-capacities", "8,252"])
    err = capsys.readouterr().err
    assert code == 2 and list(output.parent.iterdir()) == []
    assert err.strip().splitlines()[-1].endswith(
        "--patch-capacities 8 holds no image: the processor's smallest image (min_pixels 3136) has 16 patches or "
        "more; give capacities of at least 16"), err
