"""Image preparation RESIZE_NORMALIZE_PATCHES: decoded pixels to flattened vision patches.

The arithmetic is the Qwen2-VL image processor's (the PIL path of `transformers`): composite any
transparency onto white, resize with PIL bicubic to the "smart" size (both sides multiples of
patch_size * merge_size, the pixel count inside [min_pixels, max_pixels], the aspect ratio kept),
rescale by 1/255 in float64 then float32, normalise per channel in float32, and flatten into
patches ordered merge-window by merge-window, each patch repeated `temporal_patch_size` times (a
still image is one temporal frame). Parameters come from the contract's ImagePreparationData.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.frontend.images.errors import ImageRejected

TEMPORAL_PATCH_SIZE = 2  # the vision encoder's temporal kernel; a still image fills both frames


@dataclass(frozen=True)
class PreparationParams:
    """The contract's image preparation data."""

    patch_size: int
    merge_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    min_pixels: int
    max_pixels: int
    temporal_patch_size: int = TEMPORAL_PATCH_SIZE

    @property
    def patch_width(self) -> int:
        """Values of one flattened patch: channels x temporal x patch x patch."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclass(frozen=True)
class PreparedImage:
    """One image as vision patches: float32 [grid_h * grid_w, patch_width] and its patch grid."""

    patches: np.ndarray
    grid_h: int
    grid_w: int
    digest: str  # content hash of the source bytes, the prefix-cache key of its features

    @property
    def num_patches(self) -> int:
        return self.grid_h * self.grid_w


def smart_size(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Target (height, width): multiples of `factor`, pixel count within bounds, aspect ratio kept."""
    if max(height, width) / min(height, width) > 200:
        raise ImageRejected(f"image aspect ratio {max(height, width) / min(height, width):.1f} exceeds 200")
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def to_rgb(image):
    """RGB PIL image; transparency composited onto a white background (the processor's rule)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")


def normalized_pixels(image, params: PreparationParams) -> np.ndarray:
    """float32 [3, H', W'] of a decoded PIL image: resized, rescaled and normalised."""
    from PIL import Image

    rgb = to_rgb(image)
    height, width = rgb.height, rgb.width
    factor = params.patch_size * params.merge_size
    new_h, new_w = smart_size(height, width, factor, params.min_pixels, params.max_pixels)
    resized = np.array(rgb.resize((new_w, new_h), resample=Image.Resampling.BICUBIC))
    chw = np.moveaxis(resized, -1, 0)
    scaled = (chw.astype(np.float64) * (1.0 / 255.0)).astype(np.float32)
    mean = np.array(params.mean, dtype=np.float32)
    std = np.array(params.std, dtype=np.float32)
    return ((scaled.T - mean) / std).T


def patchify(pixels: np.ndarray, params: PreparationParams) -> tuple[np.ndarray, int, int]:
    """Flattened patches [grid_h * grid_w, patch_width] in merge-window order, and the grid."""
    channels, height, width = pixels.shape
    p, m, t = params.patch_size, params.merge_size, params.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    patches = pixels.reshape(channels, grid_h // m, m, p, grid_w // m, m, p)
    patches = np.transpose(patches, (1, 4, 2, 5, 0, 3, 6))
    patches = np.broadcast_to(patches[:, :, :, :, :, None, :, :], (*patches.shape[:5], t, *patches.shape[5:]))
    return np.ascontiguousarray(patches.reshape(grid_h * grid_w, channels * t * p * p)), grid_h, grid_w


def prepare_image(image, params: PreparationParams, digest: str) -> PreparedImage:
    """A decoded PIL image as vision patches."""
    patches, grid_h, grid_w = patchify(normalized_pixels(image, params), params)
    return PreparedImage(patches, grid_h, grid_w, digest)
