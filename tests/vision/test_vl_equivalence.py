"""Qwen2.5-VL equivalence with transformers (float32): image preparation, layout positions, vision
features, and greedy tokens over 16 steps with one and with two images."""

from __future__ import annotations

import functools
import io

import numpy as np
import pytest
import torch

from helios.frontend.images.layout import VISION_OUTPUTS, LayoutParams, layout_prompt, vision_tensors
from helios.frontend.images.preparation import PreparationParams, prepare_image
from helios.ignition.recipes import qwen_vl
from helios.ignition.recipes.vision import vision_features

from .paged_greedy import encode_images, greedy
from .tiny_vl import (IMAGE_TOKEN, MAX_PIXELS, MEAN, MIN_PIXELS, STD, VISION_END, VISION_START, hf_image_processor,
                      image_bytes, tiny_model)

PIL = pytest.importorskip("PIL.Image")
CAPACITY = 256
PARAMS = PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
LAYOUT = LayoutParams(IMAGE_TOKEN, 2, 56, 14)
IMAGES = [image_bytes(90, 60, 1), image_bytes(40, 100, 2, "JPEG"), image_bytes(300, 200, 3, "WEBP")]


class _Tensors:
    def __init__(self, state):
        self._state = state

    names = property(lambda self: frozenset(self._state))
    __contains__ = lambda self, name: name in self._state  # noqa: E731
    get = lambda self, name: self._state[name]  # noqa: E731


@pytest.fixture(scope="module")
def model():
    return shared_model_and_recipe()[0]


@pytest.fixture(scope="module")
def recipe():
    return shared_model_and_recipe()[1]


@functools.cache
def shared_model_and_recipe():
    """The tiny model and its recipe, built once per session for this module and test_pipeline
    (which imports both fixtures); neither is modified by the tests."""
    model = tiny_model()
    return model, qwen_vl.build("Qwen2_5_VLForConditionalGeneration", model.config.to_dict(),
                                _Tensors(model.state_dict()), "float32")


def _decoded(data: bytes):
    return PIL.open(io.BytesIO(data))


def _prompt_ids(count: int) -> list[int]:
    ids = [151644, 872, 198]
    for i in range(count):
        ids += [VISION_START, IMAGE_TOKEN, VISION_END, 40 + i]
    return ids + [151645, 198, 151644, 77091, 198]


def test_preparation_equals_processor():
    reference = hf_image_processor()(images=[_decoded(b) for b in IMAGES], return_tensors="np")
    mine = [prepare_image(_decoded(b), PARAMS, "") for b in IMAGES]
    assert [[1, m.grid_h, m.grid_w] for m in mine] == reference["image_grid_thw"].tolist()
    np.testing.assert_array_equal(np.concatenate([m.patches for m in mine]), reference["pixel_values"])


@pytest.mark.parametrize("count", [1, 2])
def test_greedy_tokens_equal_transformers(model, recipe, count):
    data = IMAGES[:count]
    reference = hf_image_processor()(images=[_decoded(b) for b in data], return_tensors="pt")
    images = [prepare_image(_decoded(b), PARAMS, "") for b in data]
    prompt = layout_prompt(_prompt_ids(count), images, LAYOUT)
    input_ids = torch.tensor([prompt.token_ids])
    positions, delta = model.model.get_rope_index(input_ids, (input_ids == IMAGE_TOKEN).int(),
                                                  reference["image_grid_thw"])
    np.testing.assert_array_equal(positions[:, 0].T.numpy(), prompt.positions)
    assert int(delta) == prompt.position_delta
    features = encode_images(recipe, vision_tensors(images, LAYOUT, CAPACITY))
    with torch.no_grad():
        expected_features = torch.cat(list(model.model.get_image_features(
            reference["pixel_values"], reference["image_grid_thw"]).pooler_output))
        torch.testing.assert_close(features[: len(expected_features)], expected_features, atol=1e-5, rtol=1e-4)
        expected = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                  pixel_values=reference["pixel_values"], image_grid_thw=reference["image_grid_thw"],
                                  max_new_tokens=16, do_sample=False)[0, input_ids.shape[1]:].tolist()
    assert greedy(recipe, prompt, features, 16) == expected
    assert len(set(expected)) > 1
    assert greedy(recipe, prompt, torch.zeros_like(features), 16) != expected  # the images matter


def test_vision_encoder_captures_at_a_patch_capacity(recipe):
    images = [prepare_image(_decoded(b), PARAMS, "") for b in IMAGES[:2]]
    tensors = vision_tensors(images, LAYOUT, CAPACITY)
    eager = encode_images(recipe, tensors)
    weights = {w.name: w.tensor for w in recipe.vision_weights}

    class Encoder(torch.nn.Module):
        def forward(self, weights, *inputs):
            return vision_features(recipe.vision, weights, *inputs)

    inputs = tuple(torch.from_numpy(tensors[name]) for name in VISION_OUTPUTS)
    program = torch.export.export(Encoder(), (weights, *inputs))
    captured = encode_images(recipe, tensors, lambda w, *x: program.module()(w, *x))
    torch.testing.assert_close(captured, eager, atol=1e-6, rtol=1e-6)
