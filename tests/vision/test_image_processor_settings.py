"""A checkpoint's preprocessor_config.json is served with the pixels transformers' image processor
(Qwen2VLImageProcessor, the PIL path) makes from it, or refused at prepare naming the setting: its
resample, do_rescale, rescale_factor, do_normalize and do_convert_rgb were ignored (another filter or
scale served other pixels silently), and a file that left image_mean/image_std or the pixel bounds to
the processor class defaults was refused. Its patch_size, merge_size and temporal_patch_size must be the
vision encoder's (transformers fails on every image otherwise; they were not read)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helios.frontend.images.preparation import PreparationParams, prepare_image
from helios.ignition.architecture import CheckpointError
from helios.ignition.preparation.vision_contract import read_image_processor
from helios.ignition.recipes.base import UnsupportedCheckpoint

BOUNDS = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 40}
NORMALIZE = {"image_mean": [0.5, 0.4, 0.3], "image_std": [0.2, 0.25, 0.3]}


def _images():
    """An image scaled up to min_pixels, one scaled down to max_pixels (both the class defaults'), and
    one between the tests' bounds."""
    from PIL import Image

    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)) for h, w in
            ((20, 30), (1100, 1000), (90, 120))]


def _write(directory, settings: dict) -> None:
    (directory / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Qwen2VLImageProcessor", **settings}))


@pytest.mark.parametrize("settings", [
    {},
    NORMALIZE,
    BOUNDS,
    {**NORMALIZE, "size": {"shortest_edge": BOUNDS["min_pixels"], "longest_edge": BOUNDS["max_pixels"]}},
    {**NORMALIZE, **BOUNDS, "size": None},
    {**NORMALIZE, **BOUNDS, "do_normalize": False},
    {**BOUNDS, "do_normalize": None, "image_std": [0.0, 0.0, 0.0]},
    {**NORMALIZE, **BOUNDS, "resample": 3, "do_rescale": True, "rescale_factor": 0.00392156862745098,
     "do_convert_rgb": True, "do_resize": True},
    {**NORMALIZE, **BOUNDS, "rescale_factor": 0.003921568627451},  # float32 pixels as 1/255's
], ids=["class-defaults", "no-bounds", "no-mean-std", "size", "null-size", "no-normalize", "null-normalize",
        "explicit-defaults", "rounded-factor"])
def test_served_pixels_are_the_processors(tmp_path, settings):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    _write(tmp_path, settings)
    read = read_image_processor(tmp_path)
    params = PreparationParams(14, 2, read.mean, read.std, read.min_pixels, read.max_pixels)
    reference = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)
    for image in _images():
        expected = reference(images=[image])["pixel_values"]
        np.testing.assert_array_equal(prepare_image(image, params, "").patches, expected)


@pytest.mark.parametrize("change, phrase", [
    ({"resample": 2}, "resample 2 is not supported"),
    ({"resample": 3.0}, "resample 3.0 is not supported"),  # transformers resizes bilinear then
    ({"resample": None}, "resample None is not supported"),
    ({"do_rescale": False}, "do_rescale False is not supported"),
    ({"do_rescale": None}, "do_rescale None is not supported"),
    ({"rescale_factor": 1 / 127.5}, "rescale_factor 0.00784313725490196 is not supported"),
    ({"rescale_factor": 0.0039215686}, "rescale_factor 0.0039215686 is not supported"),
    ({"rescale_factor": "0.00392156862745098"}, "rescale_factor '0.00392156862745098' is not supported"),
    ({"do_convert_rgb": False}, "do_convert_rgb False is not supported"),
    ({"do_resize": False}, "do_resize False is not supported"),
], ids=["bilinear", "float-bicubic", "null-resample", "no-rescale", "null-rescale", "rescale-2/255",
        "inexact-factor", "string-factor", "no-rgb", "no-resize"])
def test_settings_the_contract_cannot_carry_are_refused(tmp_path, change, phrase):
    _write(tmp_path, {**NORMALIZE, **BOUNDS, **change})
    with pytest.raises(UnsupportedCheckpoint, match=f"preprocessor_config.json: {phrase}"):
        read_image_processor(tmp_path)


def test_a_null_mean_is_still_refused(tmp_path):
    """transformers refuses to normalize with a null image_mean; only a missing one takes the default."""
    _write(tmp_path, {**BOUNDS, "image_mean": None})
    with pytest.raises(CheckpointError, match="lacks image_mean, image_std or pixel bounds"):
        read_image_processor(tmp_path)


@pytest.fixture(scope="module")
def vl_checkpoints(tmp_path_factory):
    """The tiny Qwen2.5-VL (14-pixel patches) and Qwen3-VL (16) checkpoints' weights and config,
    written once (a test writes the preprocessor_config.json)."""
    from .tiny_vl import tiny_model
    from .tiny_vl3 import tiny_model3

    directories = {}
    for name, factory in (("qwen2_5_vl", tiny_model), ("qwen3_vl", tiny_model3)):
        directories[name] = tmp_path_factory.mktemp(name)
        factory().save_pretrained(directories[name])
    return directories


def _vision_preparation(directory):
    from helios.ignition.program_spec import Capacity, Operation
    from helios.ignition.recipes import load_checkpoint
    from helios.ignition.vision_plan import vision_preparation

    text = [(Operation.DECODE, Capacity(1, 1)), (Operation.PREFILL, Capacity(1, 16))]
    return vision_preparation(directory, load_checkpoint(directory), text)


@pytest.mark.parametrize("family, change, phrase", [
    ("qwen2_5_vl", {"patch_size": 16}, "patch_size 16 is not config.json's vision_config patch_size 14"),
    ("qwen2_5_vl", {"merge_size": 1}, "merge_size 1 is not config.json's vision_config spatial_merge_size 2"),
    ("qwen2_5_vl", {"temporal_patch_size": 1}, "temporal_patch_size 1 is not config.json's vision_config "
                                               "temporal_patch_size 2"),
    ("qwen3_vl", {}, "patch_size 14 is not config.json's vision_config patch_size 16"),  # the class default
    ("qwen2_5_vl", {"patch_size": 14.0}, "patch_size must be a positive integer, got 14.0"),
], ids=["patch", "merge", "temporal", "default-patch", "float-patch"])
def test_a_processor_whose_patches_do_not_fit_the_encoder_is_refused(vl_checkpoints, family, change, phrase):
    """transformers' processor cuts patches by its own patch_size and temporal_patch_size and counts an
    image's tokens by its own merge_size, the encoder by config.json's: apart, transformers fails on
    every image (a reshape, or features that do not match the image tokens). The served frontend cut
    by the encoder's alone: such a checkpoint was prepared and served, its processor's settings unread."""
    _write(vl_checkpoints[family], {**NORMALIZE, **BOUNDS, **change})
    with pytest.raises(CheckpointError, match=f"preprocessor_config.json: {phrase}"):
        _vision_preparation(vl_checkpoints[family])


@pytest.mark.parametrize("family, geometry", [
    ("qwen2_5_vl", {}), ("qwen2_5_vl", {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}),
    ("qwen3_vl", {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2})])
def test_a_processor_whose_patches_fit_the_encoder_is_prepared(vl_checkpoints, family, geometry):
    _write(vl_checkpoints[family], {**NORMALIZE, **BOUNDS, **geometry})
    assert _vision_preparation(vl_checkpoints[family]) is not None
