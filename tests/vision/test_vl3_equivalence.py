"""Qwen3-VL equivalence with transformers (float32): image preparation with 16-pixel patches, layout
positions, vision features with their DeepStack blocks, and greedy tokens over 16 steps with one
and with two images (interleaved mrope, DeepStack added after the first decoder layers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helios.frontend.images.layout import VISION_OUTPUTS, LayoutParams, layout_prompt, vision_tensors
from helios.frontend.images.preparation import PreparationParams, prepare_image
from helios.ignition.multimodal import mrope_components
from helios.ignition.recipes import qwen_vl
from helios.ignition.recipes.vision import vision_features

from .paged_greedy import encode_images, greedy
from .test_vl_equivalence import IMAGES, _decoded, _prompt_ids, _Tensors
from .tiny_vl import IMAGE_TOKEN
from .tiny_vl3 import MAX_PIXELS, MEAN, MIN_PIXELS, PATCH, STD, hf_image_processor3, tiny_model3

CAPACITY = 128
PARAMS = PreparationParams(PATCH, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
LAYOUT = LayoutParams(IMAGE_TOKEN, 2, 2 * PATCH, PATCH)  # windows of one merge unit: the reference order


@pytest.fixture(scope="module")
def model():
    return tiny_model3()


@pytest.fixture(scope="module")
def recipe(model):
    return qwen_vl.build("Qwen3VLForConditionalGeneration", model.config.to_dict(), _Tensors(model.state_dict()),
                         "float32")


def test_interleaved_mrope_components():
    assert mrope_components([2, 3, 3], interleaved=True).tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert mrope_components([2, 3, 3]).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]


def test_recipe_reads_the_checkpoint(recipe):
    vision = recipe.vision
    assert vision.family == "qwen3_vl" and vision.deepstack_blocks == (0, 1) and vision.feature_width == 3 * 64
    assert recipe.text.architecture.qk_norm and vision.full_attention_blocks == (0, 1, 2)


@pytest.mark.parametrize("count", [1, 2])
def test_greedy_tokens_equal_transformers(model, recipe, count):
    data = IMAGES[:count]
    reference = hf_image_processor3()(images=[_decoded(b) for b in data], return_tensors="pt")
    images = [prepare_image(_decoded(b), PARAMS, "") for b in data]
    assert [[1, m.grid_h, m.grid_w] for m in images] == reference["image_grid_thw"].tolist()
    np.testing.assert_array_equal(np.concatenate([m.patches for m in images]), reference["pixel_values"])
    prompt = layout_prompt(_prompt_ids(count), images, LAYOUT)
    input_ids = torch.tensor([prompt.token_ids])
    positions, delta = model.model.get_rope_index(input_ids, (input_ids == IMAGE_TOKEN).int(),
                                                  reference["image_grid_thw"])
    np.testing.assert_array_equal(positions[:, 0].T.numpy(), prompt.positions)
    assert int(delta) == prompt.position_delta
    features = encode_images(recipe, vision_tensors(images, LAYOUT, CAPACITY))
    with torch.no_grad():
        out = model.model.get_image_features(reference["pixel_values"], reference["image_grid_thw"])
        blocks = [out.pooler_output, *out.deepstack_features]  # each split per image, or whole
        expected_features = torch.cat([torch.cat(list(b)) if isinstance(b, (tuple, list)) else b for b in blocks],
                                      dim=-1)
        torch.testing.assert_close(features[: len(expected_features)], expected_features, atol=1e-5, rtol=1e-4)
        expected = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                  pixel_values=reference["pixel_values"], image_grid_thw=reference["image_grid_thw"],
                                  max_new_tokens=16, do_sample=False)[0, input_ids.shape[1]:].tolist()
    assert greedy(recipe, prompt, features, 16) == expected
    assert len(set(expected)) > 1
    without_deepstack = features.clone()
    without_deepstack[:, 64:] = 0
    assert greedy(recipe, prompt, without_deepstack, 16) != expected  # the DeepStack blocks matter


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
