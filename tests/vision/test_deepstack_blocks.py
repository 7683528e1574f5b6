"""Qwen3-VL `deepstack_visual_indexes` outside the vision encoder's blocks (at or past its depth, or
negative) or named twice are refused when the recipe is built: transformers skips such an index (its
merger unused), so the encoder made fewer DeepStack features than the prepared programs' feature width
counts, and prepare failed only at capture with a shape error."""

from __future__ import annotations

import copy
import re

import pytest

from helios.ignition.recipes import qwen_vl
from helios.ignition.recipes.base import UnsupportedCheckpoint

from .test_vision_config_defaults import _checkpoint
from .tiny_vl3 import tiny_model3

SOURCE = "Qwen3VLForConditionalGeneration"


@pytest.mark.parametrize("indexes", [[0, 3], [0, 7], [-1, 1], [1, 1]], ids=["depth", "past", "negative", "twice"])
def test_deepstack_blocks_outside_the_encoder_are_refused(indexes):
    _, config, tensors = _checkpoint(tiny_model3)  # depth 3, DeepStack blocks [0, 1]
    config = copy.deepcopy(config)
    config["vision_config"]["deepstack_visual_indexes"] = indexes
    message = f"deepstack_visual_indexes {indexes} must be distinct blocks of the vision encoder's depth 3 (0 to 2)"
    with pytest.raises(UnsupportedCheckpoint, match=re.escape(message)):
        qwen_vl.build(SOURCE, config, tensors, "float32")


def test_deepstack_blocks_inside_the_encoder_are_prepared():
    _, config, tensors = _checkpoint(tiny_model3)
    config = copy.deepcopy(config)
    config["vision_config"]["deepstack_visual_indexes"] = [2, 0]
    vision = qwen_vl.build(SOURCE, config, tensors, "float32").vision
    assert vision.deepstack_blocks == (2, 0) and vision.feature_width == 3 * vision.out_hidden_size
