"""A request's images through the contract's selectors: decode, prepare, lay out.

`ImagePipeline.from_contract` reads the model contract's image-preparation and image-layout
selectors with their data and the vision capacities; selectors this frontend does not implement
are a `LoadError` at startup. `prepare` turns a request's image URLs and its rendered prompt ids
(one feature placeholder per image) into the expanded prompt, its rotary positions and feature
mapping, and each image's vision tensors at the smallest captured patch capacity that holds it
(images are encoded one at a time, so a repeated image's features can be reused by content hash).
Each image is decoded and prepared before the next is decoded (a request holds one image's decoded
pixels at a time), a request's remote images are fetched by one deadline (`fetch_deadline`), and an
image's error names its part (``messages[1].content[0]``) when its URL is an `ImageSource`.
Layouts: SPATIAL_POSITIONS_3D (`layout`) and FEATURE_SPAN (`feature_span`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from helios.contract import serving_pb2 as spb
from helios.errors import LoadError
from helios.frontend.images.decode import ImageLimits, check_image_count, decode_image_url, fetch_deadline
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import LAYOUT_OUTPUTS, ImagePrompt, LayoutParams, features_of, layout_prompt, vision_tensors
from helios.frontend.images.feature_span import SPAN_OUTPUTS, TEMPORAL_PATCH_SIZE, span_prompt, span_tensors
from helios.frontend.images.preparation import TEMPORAL_PATCH_SIZE as VIDEO_TEMPORAL_PATCH_SIZE
from helios.frontend.images.preparation import PreparationParams, PreparedImage, prepare_image

SUPPORTED_PREPARATION = (spb.IMAGE_PREPARATION_RESIZE_NORMALIZE_PATCHES,)
SUPPORTED_LAYOUT = (spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D, spb.IMAGE_LAYOUT_FEATURE_SPAN)
_OUTPUTS = {spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D: LAYOUT_OUTPUTS, spb.IMAGE_LAYOUT_FEATURE_SPAN: SPAN_OUTPUTS}


@dataclass(frozen=True)
class PreparedImages:
    """What the packer binds for one request's images."""

    prompt: ImagePrompt
    images: tuple[PreparedImage, ...]
    patch_capacities: tuple[int, ...]  # per image: the VISION variant that encodes it
    tensors: tuple[dict[str, np.ndarray], ...]  # per image: the layout's vision outputs at that capacity
    feature_counts: tuple[int, ...]  # per image: its features (the rows of its encoded features in use)

    @property
    def digests(self) -> tuple[str, ...]:
        return tuple(image.digest for image in self.images)



@dataclass(frozen=True)
class ImagePipeline:
    preparation: PreparationParams
    layout: LayoutParams
    patch_capacities: tuple[int, ...]
    limits: ImageLimits
    kind: int = spb.IMAGE_LAYOUT_SPATIAL_POSITIONS_3D  # the contract's ImageLayout

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
        kind = frontend.image_layout
        unknown = sorted(set(frontend.image_layout_data.outputs) - set(_OUTPUTS[kind]))
        if unknown:
            raise LoadError(f"the contract binds image layout outputs {unknown} that "
                            f"{spb.ImageLayout.Name(kind)[len('IMAGE_LAYOUT_'):]} does not produce")
        data, vision = frontend.image_preparation_data, model.vision
        span = kind == spb.IMAGE_LAYOUT_FEATURE_SPAN
        preparation = PreparationParams(int(data.patch_size), int(data.merge_size), tuple(data.mean), tuple(data.std),
                                        int(data.min_pixels), int(data.max_pixels),
                                        TEMPORAL_PATCH_SIZE if span else VIDEO_TEMPORAL_PATCH_SIZE)
        window_units = math.isqrt(vision.features_per_window)
        if not span and window_units * window_units != vision.features_per_window:
            raise LoadError(f"SPATIAL_POSITIONS_3D needs square windows; features_per_window is "
                            f"{vision.features_per_window}")
        layout = LayoutParams(int(frontend.image_layout_data.feature_ids[0]), preparation.merge_size,
                              window_units * preparation.merge_size * preparation.patch_size, preparation.patch_size)
        return cls(preparation, layout, tuple(int(c) for c in vision.patch_capacities), limits, kind)

    def prepare(self, urls: list[str], token_ids) -> PreparedImages:
        check_image_count(urls, self.limits)
        deadline = fetch_deadline()
        images = [self._prepare_one(url, deadline) for url in urls]
        span = self.kind == spb.IMAGE_LAYOUT_FEATURE_SPAN
        prompt = (span_prompt if span else layout_prompt)(token_ids, images, self.layout)
        capacities = []
        for number, image in enumerate(images, 1):
            capacity = next((c for c in self.patch_capacities if c >= image.num_patches), None)
            if capacity is None:  # a thin image is scaled up to min_pixels on its short side: many patches
                raise ImageRejected(f"image {number} needs {image.num_patches} vision patches; at most "
                                    f"{self.patch_capacities[-1]} are prepared (send a smaller image, or one "
                                    f"with a less extreme aspect ratio)").at(getattr(urls[number - 1], "where", None))
            capacities.append(capacity)
        tensors = tuple(span_tensors(image, c) if span else vision_tensors([image], self.layout, c)
                        for image, c in zip(images, capacities))
        counts = tuple(features_of(image, self.layout.merge_size) for image in images)
        return PreparedImages(prompt, tuple(images), tuple(capacities), tensors, counts)

    def _prepare_one(self, url: str, deadline: float) -> PreparedImage:
        """One image decoded (fetched by the request's `deadline`) and prepared; the decoded pixels
        (up to `ImageLimits.max_pixels`) are dropped before the next image is decoded, so a request
        holds one image's pixels at a time."""
        decoded = decode_image_url(url, self.limits, deadline)
        try:
            return prepare_image(decoded.image, self.preparation, decoded.digest)
        except ImageRejected as error:
            raise error.at(getattr(url, "where", None)) from None
