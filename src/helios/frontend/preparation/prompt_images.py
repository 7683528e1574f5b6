"""A chat prompt's images through the contract's image pipeline: the prompt with each image's
placeholder expanded to its features, and the `RequestImages` the model worker binds.

A model without a vision contract, or whose image selectors this frontend does not implement, refuses
image parts (400). The stable prefix (what later turns
render identically) moves by the features of the images inside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import ROTARY_OFFSETS
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.preparation.prompt import Prompt
from helios.runtime.execution.images import RequestImages


@dataclass(frozen=True)
class UnavailableImages:
    """A vision contract whose image selectors this frontend does not implement: text requests
    serve, image parts are refused with `reason`."""

    reason: str


def with_images(prompt: Prompt, pipeline: ImagePipeline | UnavailableImages | None
                ) -> tuple[Prompt, RequestImages | None]:
    if not prompt.image_urls:
        return prompt, None
    if pipeline is None:
        raise ImageRejected("this model takes no images (its core declares no vision contract)")
    if isinstance(pipeline, UnavailableImages):
        raise ImageRejected(f"this server cannot prepare this model's images: {pipeline.reason}")
    prepared = pipeline.prepare(list(prompt.image_urls), prompt.token_ids)
    feature_id = pipeline.layout.feature_id
    before = [i for i, token in enumerate(prompt.token_ids) if token == feature_id]
    shift = sum(count - 1 for index, count in zip(before, prepared.feature_counts) if index < prompt.stable_prefix_len)
    expanded = dataclasses.replace(prompt, token_ids=prepared.prompt.token_ids,
                                   stable_prefix_len=prompt.stable_prefix_len + shift)
    bounds = np.cumsum((0, *prepared.feature_counts))
    tokens = prepared.prompt.feature_tokens
    images = RequestImages(
        digests=prepared.digests, patch_capacities=prepared.patch_capacities, vision_inputs=prepared.tensors,
        feature_tokens=tuple(tokens[bounds[i]:bounds[i + 1]] for i in range(len(prepared.images))),
        token_outputs={ROTARY_OFFSETS: prepared.prompt.rotary_offsets})
    return expanded, images
