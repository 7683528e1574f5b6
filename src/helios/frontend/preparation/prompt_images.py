"""A chat prompt's images through the contract's image pipeline: the prompt with each image's
placeholder expanded to its features, and the `RequestImages` the model worker binds.

A model without a vision contract, or whose image selectors this frontend does not implement, refuses
image parts (400). `check_image_parts` refuses those, and more image parts than the request bound,
before the prompt is rendered: the text bound leaves image parts out, and rendering and tokenizing
tens of thousands of placeholders of tiny parts would cost seconds. The stable prefix (what later turns
render identically) moves by the features of the images inside it.

A text completion's prompt (``/v1/completions``) takes no images: its control markers are tokens on
purpose, so its text or ids could hold the model's image placeholder (``<|image_pad|>``), which would
reach the model as a feature slot with no image's features behind it. `check_completion_prompt`
refuses that (400 naming the placeholder). A chat message's text never holds one: client text is
tokenized as text (`helios.frontend.preparation.control_markers`), only image parts place them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from helios.errors import RequestError
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


class ImagePlaceholderInPrompt(RequestError):
    """A text completion's prompt holds the model's image placeholder (see the module docstring)."""

    param = "prompt"


def check_completion_prompt(prompt_ids: Sequence[int], pipeline: ImagePipeline | UnavailableImages | None,
                            token_text: Callable[[int], str | None]) -> None:
    """`ImagePlaceholderInPrompt` where a completion prompt's ids hold the image feature placeholder of
    `pipeline` (None or `UnavailableImages`: a model whose placeholders this frontend lays out for no
    image); `token_text` names the id (the tokenizer's ``id_to_token``)."""
    if not isinstance(pipeline, ImagePipeline):
        return
    feature_id = pipeline.layout.feature_id
    for position, token in enumerate(prompt_ids):
        if token == feature_id:
            raise ImagePlaceholderInPrompt(
                f"the prompt holds the image placeholder {token_text(feature_id)!r} (token {feature_id}, at prompt "
                f"position {position}), which stands for an image's features; /v1/completions takes no images: "
                "send images as image_url parts of a /v1/chat/completions user message")


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
