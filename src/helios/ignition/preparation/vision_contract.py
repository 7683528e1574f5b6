"""The contract declarations of a vision-language recipe: vision capacities, image sentinels, and the
frontend's image-preparation and image-layout selectors with their data.

An image sentinel the checkpoint's vocabulary places inside the sampled range (Qwen's
``<|image_pad|>`` lies below sampleable ids) is declared in ``vocabulary.excluded_ids`` too: it
stays input-only, because the runtime clears excluded ids in every row's sampling mask.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helios.contract import serving_pb2 as spb
from helios.ignition.architecture import CheckpointError
from helios.ignition.multimodal_spec import ROTARY_OFFSETS, VISION_INPUTS
from helios.ignition.recipes.base import UnsupportedCheckpoint
from helios.ignition.recipes.checkpoint import read_json
from helios.ignition.recipes.qwen_vl import VisionLanguageRecipe

LAYOUT_OUTPUTS = (*VISION_INPUTS, ROTARY_OFFSETS)
PROCESSOR_CONFIG = "preprocessor_config.json"
MAX_PIXELS = 2**31 - 1  # the contract's extents are 32-bit


# transformers 5's image processor class defaults (Qwen2VLImageProcessor's: the processor of Qwen2-VL,
# Qwen2.5-VL and Qwen3-VL alike), which it takes for the keys a preprocessor_config.json leaves out (a
# null `size` too): a file without image_mean/image_std or pixel bounds was refused.
REFERENCE_PROCESSOR_DEFAULTS: dict[str, Any] = {
    "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
    "size": {"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280}, "do_resize": True, "resample": 3,
    "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
    "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
# The processor's patch geometry and the vision config's key for each: the processor cuts and groups
# the patches the encoder reads (see `check_patch_geometry`).
GEOMETRY_KEYS = (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                 ("temporal_patch_size", "temporal_patch_size"))
BICUBIC = 3  # PIL's Image.Resampling.BICUBIC, the served resize's filter
IDENTITY = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # mean and std that leave the rescaled pixels as they are


@dataclass(frozen=True)
class ImageProcessorSettings:
    """The checkpoint's image processor settings (preprocessor_config.json)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int
    # The processor's patch geometry (GEOMETRY_KEYS), which must be the encoder's.
    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2


def read_image_processor(checkpoint: Path) -> ImageProcessorSettings:
    """The processor settings of a checkpoint directory (both the `min_pixels`/`max_pixels` and the
    `size: {shortest_edge, longest_edge}` spellings, a missing key read as transformers reads it:
    `REFERENCE_PROCESSOR_DEFAULTS`); a missing or incomplete file is an error. `do_normalize` false
    is served as the identity mean and std; settings the contract cannot express are refused
    (`check_served_arithmetic`)."""
    path = Path(checkpoint) / PROCESSOR_CONFIG
    try:
        config = read_json(path)
    except CheckpointError as exc:
        raise CheckpointError(f"a vision-language checkpoint needs a readable {PROCESSOR_CONFIG}: {exc}") from None
    config = {**REFERENCE_PROCESSOR_DEFAULTS, **config}
    check_served_arithmetic(config)
    size = config["size"] if config["size"] is not None else REFERENCE_PROCESSOR_DEFAULTS["size"]
    try:
        mean, std = (tuple(float(v) for v in config["image_mean"]), tuple(float(v) for v in config["image_std"])
                     ) if config["do_normalize"] else IDENTITY
        settings = ImageProcessorSettings(mean, std, int(config.get("min_pixels") or size["shortest_edge"]),
                                          int(config.get("max_pixels") or size["longest_edge"]),
                                          *(_geometry(config, key) for key, _ in GEOMETRY_KEYS))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{PROCESSOR_CONFIG} lacks image_mean, image_std or pixel bounds ({exc})") from None
    # Every image is normalized by them at serving: a zero or non-finite std would make it NaN.
    if (len(settings.mean) != 3 or len(settings.std) != 3 or not all(map(math.isfinite, settings.mean + settings.std))
            or min(settings.std) <= 0):
        raise CheckpointError(f"{PROCESSOR_CONFIG}: image_mean and image_std must be 3 finite values each, the std "
                              f"positive; got {list(settings.mean)} and {list(settings.std)}")
    if not 1 <= settings.min_pixels <= settings.max_pixels <= MAX_PIXELS:
        raise CheckpointError(f"{PROCESSOR_CONFIG}: pixel bounds must satisfy 1 <= min_pixels <= max_pixels <= "
                              f"{MAX_PIXELS}, got {settings.min_pixels} and {settings.max_pixels}")
    return settings


def _geometry(config: dict[str, Any], key: str) -> int:
    value = config[key]
    if type(value) is not int or value < 1:  # transformers cuts patches by it: 14.0 or "14" fails there
        raise CheckpointError(f"{PROCESSOR_CONFIG}: {key} must be a positive integer, got {value!r}")
    return value


def check_patch_geometry(vision: Any, processor: ImageProcessorSettings) -> None:
    """Refuses a processor whose patch geometry is not the encoder's (`vision`: the recipe's
    VisionArchitecture). transformers' processor cuts patches of its own patch_size and temporal
    size and counts an image's tokens by its own merge_size, while the encoder reshapes and merges
    them by config.json's vision_config: with any of them apart transformers fails on every image
    (a reshape, or features and image tokens that do not match). The served frontend cuts by the
    encoder's geometry alone, so such a checkpoint was served without error, its processor unread."""
    for key, vision_key in GEOMETRY_KEYS:
        ours, theirs = getattr(processor, key), getattr(vision, key)
        if ours != theirs:
            raise CheckpointError(f"{PROCESSOR_CONFIG}: {key} {ours} is not config.json's vision_config "
                                  f"{vision_key} {theirs}: the processor's patches do not fit the vision encoder "
                                  f"(a missing key is the processor class default, 14 / 2 / 2)")


def check_served_arithmetic(config: dict[str, Any]) -> None:
    """Refuses the processor settings (defaults filled) under which transformers' processor makes
    other pixels than the served image preparation, which always converts to RGB, resizes with PIL
    bicubic and rescales by 1/255 (`helios.frontend.images.preparation`): the contract's
    ImagePreparationData has no field for them, and serving such a checkpoint would feed its encoder
    other pixels than it was trained on. transformers reads these flags by truth value (null is off)."""
    for key in ("do_resize", "do_convert_rgb", "do_rescale"):
        if not config[key]:
            raise UnsupportedCheckpoint(f"{PROCESSOR_CONFIG}: {key} {config[key]!r} is not supported: the served "
                                        f"image preparation always resizes, converts to RGB and rescales")
    resample = config["resample"]
    if type(resample) is not int or resample != BICUBIC:  # transformers reads 3.0 as bilinear
        raise UnsupportedCheckpoint(f"{PROCESSOR_CONFIG}: resample {resample!r} is not supported: the served "
                                    f"image preparation resizes with PIL bicubic ({BICUBIC})")
    factor = config["rescale_factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not _rescales_as_served(float(factor)):
        raise UnsupportedCheckpoint(f"{PROCESSOR_CONFIG}: rescale_factor {factor!r} is not supported: the served "
                                    f"image preparation rescales by 1/255")


def _rescales_as_served(factor: float) -> bool:
    """Whether rescaling by `factor` gives every resized byte value the float32 the served 1/255 does
    (both scale in float64, then round to float32)."""
    values = np.arange(256, dtype=np.float64)
    return np.array_equal((values * factor).astype(np.float32), (values * (1.0 / 255.0)).astype(np.float32))


MAX_ASPECT = 200  # the processor refuses images whose longer side is more than 200 times the shorter


def max_image_patches(recipe: VisionLanguageRecipe, processor: ImageProcessorSettings) -> int:
    """Patches of the largest image the processor produces (a multiple of merge^2).

    Usually the most whole merge units `max_pixels` holds; but a thin image keeps at least one
    unit on its short side, so where ``max_pixels`` is below 200 units' area its long side alone
    may pass it, and a small one scaled up to ``min_pixels`` rounds both sides up
    (`largest_resized_area`)."""
    vision = recipe.vision
    unit = vision.merge_size * vision.merge_size
    factor = vision.patch_size * vision.merge_size
    within = processor.max_pixels // (vision.patch_size * vision.patch_size) // unit * unit
    resized = largest_resized_area(factor, processor.min_pixels, processor.max_pixels)
    return max(within, resized // (vision.patch_size * vision.patch_size))


def largest_resized_area(factor: int, min_pixels: int, max_pixels: int) -> int:
    """The most pixels the Qwen-VL processor's resize (sides multiples of `factor`) gives an image
    it accepts, in the two cases where that passes ``max_pixels``: a thin image scaled down keeps
    one `factor` on its short side (its long side ``sqrt(r * max_pixels)``, largest at the aspect
    limit r = 200), and one scaled up to ``min_pixels`` rounds both sides up. The scaled sides
    depend on the aspect ratio r alone, so the rounded-up area is evaluated just past each ratio
    where either side's rounding steps (a bound, and the area of images near those ratios)."""
    thin = factor * max(factor, math.isqrt(MAX_ASPECT * max_pixels) // factor * factor)
    ratios = {1.0, float(MAX_ASPECT)}
    for k in range(1, math.isqrt(MAX_ASPECT * min_pixels) // factor + 2):
        ratios.add((k * factor) ** 2 / min_pixels)  # where the long side's rounding steps
        ratios.add(min_pixels / (k * factor) ** 2)  # where the short side's does
    scaled = 0
    for ratio in ratios:
        for r in (ratio * (1 - 1e-9), ratio * (1 + 1e-9)):
            if 1.0 <= r <= MAX_ASPECT:
                short = math.ceil(math.sqrt(min_pixels / r) / factor) * factor
                long = math.ceil(math.sqrt(min_pixels * r) / factor) * factor
                scaled = max(scaled, short * long)
    return max(thin, scaled)


def declare_vision(model: spb.ModelContract, recipe: VisionLanguageRecipe, processor: ImageProcessorSettings,
                   patch_capacities: tuple[int, ...], feature_slots: int) -> None:
    """Fills `model.vision`, the image sentinel (excluded from sampling when the sampled range holds
    it) and the frontend's image fields."""
    vision, merge = recipe.vision, recipe.vision.merge_size
    window_units = vision.window_size // merge // vision.patch_size
    unit = merge * merge
    model.vision.CopyFrom(spb.VisionContract(
        feature_slots=max(feature_slots, max(patch_capacities) // unit), features_per_window=window_units * window_units,
        patches_per_feature=unit, patch_capacities=list(patch_capacities)))
    sentinel = recipe.image_token_id
    if sentinel not in model.input_vocabulary.image_sentinel_ids:
        model.input_vocabulary.image_sentinel_ids.append(sentinel)
    sampled = model.vocabulary.sampled
    if sampled.begin <= sentinel < sampled.end and sentinel not in model.vocabulary.excluded_ids:
        model.vocabulary.excluded_ids.append(sentinel)
    frontend = model.frontend
    frontend.image_preparation = spb.IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES
    frontend.image_layout = spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D
    frontend.image_preparation_data.CopyFrom(spb.ImagePreparationData(
        patch_size=vision.patch_size, merge_size=merge, mean=list(processor.mean), std=list(processor.std),
        min_pixels=processor.min_pixels, max_pixels=processor.max_pixels))
    frontend.image_layout_data.CopyFrom(spb.ImageLayoutData(
        feature_ids=[sentinel],
        atomic_spans=[spb.AtomicSpan(token_ids=[recipe.vision_start_id, sentinel, recipe.vision_end_id])],
        outputs=list(LAYOUT_OUTPUTS)))
