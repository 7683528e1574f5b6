"""The contract declarations of a vision-language recipe: vision capacities, image sentinels, and the
frontend's image-preparation and image-layout selectors with their data."""

from __future__ import annotations

from dataclasses import dataclass

from helios.contract import serving_pb2 as spb
from helios.frontend.images.layout import VISION_OUTPUTS
from helios.ignition.recipes.qwen_vl import VisionLanguageRecipe


@dataclass(frozen=True)
class ImageProcessorSettings:
    """The checkpoint's image processor settings (preprocessor_config.json)."""

    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int


def declare_vision(model: spb.ModelContract, recipe: VisionLanguageRecipe, processor: ImageProcessorSettings,
                   patch_capacities: tuple[int, ...]) -> None:
    """Fills `model.vision`, the image sentinel and the frontend's image fields."""
    vision, merge = recipe.vision, recipe.vision.merge_size
    window_units = vision.window_size // merge // vision.patch_size
    unit = merge * merge
    model.vision.CopyFrom(spb.VisionContract(
        feature_slots=max(patch_capacities) // unit, features_per_window=window_units * window_units,
        patches_per_feature=unit, patch_capacities=list(patch_capacities)))
    if recipe.image_token_id not in model.input_vocabulary.image_sentinel_ids:
        model.input_vocabulary.image_sentinel_ids.append(recipe.image_token_id)
    frontend = model.frontend
    frontend.image_preparation = spb.IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES
    frontend.image_layout = spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D
    frontend.image_preparation_data.CopyFrom(spb.ImagePreparationData(
        patch_size=vision.patch_size, merge_size=merge, mean=list(processor.mean), std=list(processor.std),
        min_pixels=processor.min_pixels, max_pixels=processor.max_pixels))
    frontend.image_layout_data.CopyFrom(spb.ImageLayoutData(
        feature_ids=[recipe.image_token_id],
        atomic_spans=[spb.AtomicSpan(token_ids=[recipe.vision_start_id, recipe.image_token_id, recipe.vision_end_id])],
        outputs=list(VISION_OUTPUTS)))
