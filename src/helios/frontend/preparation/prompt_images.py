"""A chat prompt's images through the contract's image pipeline: the prompt with each image's
placeholder expanded to its features, and the `RequestImages` the model worker binds.

A model without a vision contract, or whose image selectors this frontend does not implement, refuses
image parts (400). `check_image_parts` refuses those, and more image parts than the request bound,
before the prompt is rendered: the text bound leaves image parts out, and rendering and tokenizing
tens of thousands of placeholders of tiny parts would cost seconds. The stable prefix (what later turns
render identically) moves by the features of the images inside it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from helios.frontend.images.decode import check_image_count
from helios.frontend.images.errors import ImageRejected
from helios.frontend.images.layout import ROTARY_OFFSETS
from helios.frontend.images.pipeline import ImagePipeline
from helios.frontend.preparation.image_parts import count_image_parts
from helios.frontend.preparation.prompt import Prompt
from helios.runtime.execution.images import RequestImages


@dataclass(frozen=True)
class UnavailableImages:
    """A vision contract whose image selectors this frontend does not implement: text requests
    serve, image parts are refused with `reason`."""

    reason: str


def check_image_parts(messages: list[dict], pipeline: ImagePipeline | UnavailableImages | None) -> None:
    """Raw request messages' image parts, before rendering: none for a model that takes none,
    at most the request bound otherwise."""
    count = count_image_parts(messages)
    if count:
        _check_takes_images(pipeline)
        check_image_count(range(count), pipeline.limits)


def _check_takes_images(pipeline: ImagePipeline | UnavailableImages | None) -> None:
    if pipeline is None:
        raise ImageRejected("this model takes no images (its core declares no vision contract)")
    if isinstance(pipeline, UnavailableImages):
        raise ImageRejected(f"this server cannot prepare this model's images: {pipeline.reason}")


def with_images(prompt: Prompt, pipeline: ImagePipeline | UnavailableImages | None
                ) -> tuple[Prompt, RequestImages | None]:
    if not prompt.image_urls:
        return prompt, None
    _check_takes_images(pipeline)
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
