"""A request's images through the contract's selectors: decode, prepare, lay out.

`ImagePipeline.from_contract` reads the model contract's image-preparation and image-layout
selectors with their data and the vision capacities; selectors this frontend does not implement
are a `LoadError` at startup. `prepare` turns a request's image URLs and its rendered prompt ids
(one feature placeholder per image) into the expanded prompt, its rotary positions and feature
mapping, and the vision tensors at the smallest captured patch capacity that holds them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.contract import serving_pb2 as spb
from helios.errors import LoadError
from helios.frontend.images.decode import ImageLimits, decode_image_urls
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import ImagePrompt, LayoutParams, layout_prompt, vision_tensors
from helios.frontend.images.preparation import PreparationParams, PreparedImage, prepare_image

SUPPORTED_PREPARATION = (spb.IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES,)
SUPPORTED_LAYOUT = (spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D,)


@dataclass(frozen=True)
class PreparedImages:
    """What the packer binds for one request's images."""

    prompt: ImagePrompt
    images: tuple[PreparedImage, ...]
    patch_capacity: int
    tensors: dict[str, np.ndarray]  # the layout's named outputs (IMAGE_TENSOR sources)

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(image.digest for image in self.images)


@dataclass(frozen=True)
class ImagePipeline:
    preparation: PreparationParams
    layout: LayoutParams
    patch_capacities: tuple[int, ...]
    limits: ImageLimits

    @classmethod
    def from_contract(cls, model: spb.ModelContract, limits: ImageLimits) -> "ImagePipeline | None":
        """The pipeline a contract declares; None for a text-only contract."""
        frontend = model.frontend
        if not model.HasField("vision"):
            return None
        if frontend.image_preparation not in SUPPORTED_PREPARATION:
            raise LoadError(f"image preparation {spb.ImagePreparation.Name(frontend.image_preparation)} is not "
                            "implemented by this frontend")
        if frontend.image_layout not in SUPPORTED_LAYOUT:
            raise LoadError(f"image layout {spb.ImageLayout.Name(frontend.image_layout)} is not implemented "
                            "by this frontend")
        data, vision = frontend.image_preparation_data, model.vision
        preparation = PreparationParams(int(data.patch_size), int(data.merge_size), tuple(data.mean), tuple(data.std),
                                        int(data.min_pixels), int(data.max_pixels))
        window_units = math.isqrt(vision.features_per_window)
        if window_units * window_units != vision.features_per_window:
            raise LoadError(f"SPATIAL_POSITIONS_3D needs square windows; features_per_window is "
                            f"{vision.features_per_window}")
        layout = LayoutParams(int(frontend.image_layout_data.feature_ids[0]), preparation.merge_size,
                              window_units * preparation.merge_size * preparation.patch_size, preparation.patch_size)
        return cls(preparation, layout, tuple(int(c) for c in vision.patch_capacities), limits)

    def prepare(self, urls: list[str], token_ids) -> PreparedImages:
        images = [prepare_image(d.image, self.preparation, d.digest) for d in decode_image_urls(urls, self.limits)]
        prompt = layout_prompt(token_ids, images, self.layout)
        patches = sum(image.num_patches for image in images)
        capacity = next((c for c in self.patch_capacities if c >= patches), None)
        if capacity is None:
            raise ImageRejected(f"the images need {patches} vision patches; at most {self.patch_capacities[-1]} "
                                "are prepared (send fewer or smaller images)")
        return PreparedImages(prompt, tuple(images), capacity, vision_tensors(images, self.layout, capacity))
