"""Qwen2.5-VL on CUDA: the captured vision encoder replayed as a CUDA graph gives the CPU path's
features (float32), and greedy tokens over 16 steps with one and two images equal the CPU path's."""

from __future__ import annotations

import io

import pytest
import torch

from gpu.test_ops_cuda import capture
from helios.frontend.images.layout import LayoutParams, layout_prompt, vision_tensors
from helios.frontend.images.preparation import PreparationParams, prepare_image
from helios.ignition.recipes import qwen_vl
from helios.ignition.recipes.vision import vision_features
from vision.paged_greedy import encode_images, greedy, vision_inputs
from vision.test_vl_equivalence import _prompt_ids, _Tensors
from vision.tiny_vl import IMAGE_TOKEN, MAX_PIXELS, MEAN, MIN_PIXELS, STD, image_bytes, tiny_model

pytestmark = pytest.mark.gpu
CAPACITY = 256
PARAMS = PreparationParams(14, 2, MEAN, STD, MIN_PIXELS, MAX_PIXELS)
LAYOUT = LayoutParams(IMAGE_TOKEN, 2, 56, 14)


def _images(count):
    from PIL import Image

    data = [image_bytes(90, 60, 1), image_bytes(40, 100, 2, "JPEG")][:count]
    return [prepare_image(Image.open(io.BytesIO(b)), PARAMS, "") for b in data]


def test_vision_graph_and_tokens_equal_cpu():
    model = tiny_model()
    recipe = qwen_vl.build("Qwen2_5_VLForConditionalGeneration", model.config.to_dict(),
                           _Tensors(model.state_dict()), "float32")
    weights = {w.name: w.tensor.cuda() for w in recipe.vision_weights}
    one, two = vision_tensors(_images(1), LAYOUT, CAPACITY), vision_tensors(_images(2), LAYOUT, CAPACITY)

    class Encoder(torch.nn.Module):
        def forward(self, weights, *inputs):
            return vision_features(recipe.vision, weights, *inputs)

    program = torch.export.export(Encoder(), (weights, *vision_inputs(one, "cuda"))).module()
    static = vision_inputs(one, "cuda")
    graph, out = capture(lambda: program(weights, *static))
    for tensors, count in ((one, 1), (two, 2)):
        for target, value in zip(static, vision_inputs(tensors, "cuda")):
            target.copy_(value)
        graph.replay()
        cpu_features = encode_images(recipe, tensors)
        torch.testing.assert_close(out.cpu(), cpu_features, atol=1e-4, rtol=1e-4)
        prompt = layout_prompt(_prompt_ids(count), _images(count), LAYOUT)
        assert greedy(recipe, prompt, out.clone(), 16) == greedy(recipe, prompt, cpu_features, 16)
