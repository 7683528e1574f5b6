"""Image layout SPATIAL_POSITIONS_3D: prepared images to prompt tokens, 3-component rotary positions,
feature mappings and the vision program's tensors (the Qwen2-VL family's layout).

Prompt: every image's single feature placeholder (the layout's feature id, rendered once per image
by the chat template) becomes `grid_h * grid_w / merge^2` placeholders, one per vision feature.
Positions: text tokens advance all three components (temporal, height, width) together; an image's
features take (start, start + row, start + column) over its merged grid, and the text after it
resumes at start + max(rows, columns). Vision tensors: the patches of all images permuted into
window order (windows of `window_size` pixels, merge units kept whole), their (row, column) rotary
positions, per-patch window and image segment ids (attention stays inside a segment; padding gets
its own segment), and the feature order that undoes the window permutation after the merger.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.preparation import PreparedImage

VISION_OUTPUTS = ("pixel_patches", "rotary_positions", "window_segments", "image_segments", "feature_order")
ROTARY_OFFSETS = "rotary_offsets"  # per prompt token: rotary position minus sequence position [T, 3]
LAYOUT_OUTPUTS = (*VISION_OUTPUTS, ROTARY_OFFSETS)


@dataclass(frozen=True)
class LayoutParams:
    """Layout data: the feature placeholder id, merge size, window and patch sizes in pixels."""

    feature_id: int
    merge_size: int
    window_size: int
    patch_size: int


@dataclass(frozen=True)
class ImagePrompt:
    """A prompt with its images laid out."""

    token_ids: tuple[int, ...]
    positions: np.ndarray  # int64 [T, 3]: temporal, height, width rotary positions
    position_delta: int  # rotary position of a later token = its index + position_delta
    feature_tokens: np.ndarray  # int64 [F]: prompt index of each vision feature, in feature order

    @property
    def rotary_offsets(self) -> np.ndarray:
        """int64 [T, 3]: each token's rotary position minus its index; tokens after the prompt keep
        the last row's offset (`position_delta` on every component)."""
        return self.positions - np.arange(len(self.positions), dtype=np.int64)[:, None]


def features_of(image: PreparedImage, merge_size: int) -> int:
    return image.num_patches // (merge_size * merge_size)


def expand_placeholders(token_ids, images: list[PreparedImage], params: LayoutParams) -> tuple[int, ...]:
    """One feature placeholder per image becomes one per feature; counts must agree."""
    slots = [i for i, token in enumerate(token_ids) if token == params.feature_id]
    if len(slots) != len(images):
        raise ImageRejected(f"the prompt has {len(slots)} image placeholders for {len(images)} images")
    out: list[int] = []
    pending = iter(images)
    for token in token_ids:
        count = features_of(next(pending), params.merge_size) if token == params.feature_id else 1
        out.extend([token] * count)
    return tuple(out)


def layout_prompt(token_ids, images: list[PreparedImage], params: LayoutParams) -> ImagePrompt:
    """Expanded tokens, rotary positions and feature token indices of a prompt with images."""
    tokens = expand_placeholders(token_ids, images, params)
    positions, feature_tokens = [], []
    index, current, pending = 0, 0, iter(images)
    while index < len(tokens):
        if tokens[index] != params.feature_id:
            positions.append((current, current, current))
            index, current = index + 1, current + 1
            continue
        image = next(pending)
        rows, cols = image.grid_h // params.merge_size, image.grid_w // params.merge_size
        for row in range(rows):
            for col in range(cols):
                positions.append((current, current + row, current + col))
        feature_tokens.extend(range(index, index + rows * cols))
        index, current = index + rows * cols, current + max(rows, cols)
    array = np.array(positions, dtype=np.int64).reshape(-1, 3)
    delta = int(array.max()) + 1 - len(tokens) if len(tokens) else 0
    return ImagePrompt(tokens, array, delta, np.array(feature_tokens, dtype=np.int64))


def window_index(grid_h: int, grid_w: int, params: LayoutParams) -> tuple[np.ndarray, list[int]]:
    """Merge units of one image in window order, and each window's unit count (nonempty windows)."""
    window = params.window_size // params.merge_size // params.patch_size
    rows, cols = grid_h // params.merge_size, grid_w // params.merge_size
    pad_h, pad_w = window - rows % window, window - cols % window
    index = np.full((rows + pad_h, cols + pad_w), -1, dtype=np.int64)
    index[:rows, :cols] = np.arange(rows * cols).reshape(rows, cols)
    blocks = index.reshape((rows + pad_h) // window, window, (cols + pad_w) // window, window)
    blocks = blocks.transpose(0, 2, 1, 3).reshape(-1, window * window)
    order, sizes = [], []
    for block in blocks:
        kept = block[block >= 0]
        if kept.size:
            order.append(kept)
            sizes.append(int(kept.size))
    return np.concatenate(order), sizes


def patch_positions(grid_h: int, grid_w: int, merge: int) -> np.ndarray:
    """(row, column) of each patch in merge-unit order, int64 [grid_h * grid_w, 2]."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    shape = (grid_h // merge, merge, grid_w // merge, merge)
    rows = rows.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    cols = cols.reshape(shape).transpose(0, 2, 1, 3).reshape(-1)
    return np.stack([rows, cols], axis=-1)


def vision_tensors(images: list[PreparedImage], params: LayoutParams, capacity: int) -> dict[str, np.ndarray]:
    """The vision program's inputs for `images` at a patch capacity (padding after the last patch)."""
    unit = params.merge_size * params.merge_size
    total = sum(image.num_patches for image in images)
    if total > capacity:
        raise ImageRejected(f"the images need {total} vision patches; at most {capacity} are prepared")
    width = images[0].patches.shape[1]
    pixels = np.zeros((capacity, width), dtype=np.float32)
    positions = np.zeros((capacity, 2), dtype=np.int64)
    windows = np.full(capacity, -1, dtype=np.int32)
    segments = np.full(capacity, -1, dtype=np.int32)
    units_order = []
    start, unit_base, window_base = 0, 0, 0
    for number, image in enumerate(images):
        units, sizes = window_index(image.grid_h, image.grid_w, params)
        patch_order = (units[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
        end = start + image.num_patches
        pixels[start:end] = image.patches[patch_order]
        positions[start:end] = patch_positions(image.grid_h, image.grid_w, params.merge_size)[patch_order]
        windows[start:end] = np.repeat(np.arange(len(sizes)) + window_base, np.array(sizes) * unit)
        segments[start:end] = number
        units_order.append(units + unit_base)
        start, unit_base, window_base = end, unit_base + len(units), window_base + len(sizes)
    windows[start:] = window_base  # padding: a segment of its own
    segments[start:] = len(images)
    order = np.argsort(np.concatenate(units_order)) if units_order else np.zeros(0, dtype=np.int64)
    feature_order = np.concatenate([order, np.arange(unit_base, capacity // unit)]).astype(np.int64)
    return {"pixel_patches": pixels, "rotary_positions": positions, "window_segments": windows,
            "image_segments": segments, "feature_order": feature_order}
