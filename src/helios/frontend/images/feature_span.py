"""Image layout FEATURE_SPAN: one contiguous span of feature tokens per image, plain positions.

Prompt: every image's single feature placeholder (the layout's feature id, rendered once per image
between the layout's atomic spans by the chat template) becomes one placeholder per vision feature,
`grid_h * grid_w / merge^2` of them; every token, feature or text, takes the next sequence position
(no rotary offsets). Vision tensors (`SPAN_OUTPUTS`): the image's patches in merge-unit order (each
run of merge^2 patches is one feature) padded to the patch capacity, and ``grid_thw`` [1, 3] int16
(1, grid_h, grid_w). Patches are still images: no temporal dimension (a patch is channels x patch x
patch values), so the preparation runs with a temporal patch size of one.
"""

from __future__ import annotations

import numpy as np

from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import ImagePrompt, LayoutParams, expand_placeholders
from helios.frontend.images.preparation import PreparedImage

SPAN_OUTPUTS = ("pixel_patches", "grid_thw")
TEMPORAL_PATCH_SIZE = 1


def span_prompt(token_ids, images: list[PreparedImage], params: LayoutParams) -> ImagePrompt:
    """Expanded tokens, plain positions (all three components equal) and feature token indices."""
    tokens = expand_placeholders(token_ids, images, params)
    positions = np.repeat(np.arange(len(tokens), dtype=np.int64)[:, None], 3, axis=1)
    features = np.array([i for i, token in enumerate(tokens) if token == params.feature_id], dtype=np.int64)
    return ImagePrompt(tokens, positions, 0, features)


def span_tensors(image: PreparedImage, capacity: int) -> dict[str, np.ndarray]:
    """The vision program's inputs for one image at a patch capacity (zero padding after it)."""
    if image.num_patches > capacity:
        raise ImageRejected(f"the image needs {image.num_patches} vision patches; at most {capacity} are prepared")
    pixels = np.zeros((capacity, image.patches.shape[1]), dtype=np.float32)
    pixels[:image.num_patches] = image.patches  # `patchify` already orders patches by merge unit
    grid = np.array([[1, image.grid_h, image.grid_w]], dtype=np.int16)
    return {"pixel_patches": pixels, "grid_thw": grid}
