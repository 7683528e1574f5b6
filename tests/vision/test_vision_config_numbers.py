"""vision_config's numbers are checked before any recipe converts them: a spatial_merge_size,
temporal_patch_size, window_size, in_channels, out_hidden_size or num_position_embeddings that is not a
positive integer (2.5 and "56" went through int()) is a CheckpointError naming the key when config.json
is read; a null geometry key (transformers keeps it null and its model fails to build) and a Qwen2.5-VL
window_size smaller than one merged patch (windows of no patch; refused only at capture) are refused
by `vision_architecture`, naming the key."""

from __future__ import annotations

import json

import pytest

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes.checkpoint import read_config
from helios.ignition.recipes.vision import QWEN2_5_VL, QWEN3_VL, vision_architecture

KEYS = ["spatial_merge_size", "temporal_patch_size", "window_size", "in_channels", "out_hidden_size",
        "num_position_embeddings"]


def _read(tmp_path, vision_config: dict) -> dict:
    config = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
              "vision_config": vision_config}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return read_config(tmp_path)


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("value", [2.5, "56", 0, -2, True])
def test_a_vision_number_that_is_not_a_positive_integer_is_refused_naming_it(tmp_path, key, value):
    with pytest.raises(CheckpointError, match=rf"config.json: vision_config\.{key} must be an integer from 1"):
        _read(tmp_path, {key: value})


def test_the_same_names_outside_vision_config_are_not_vision_geometry(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"window_size": 0, "in_channels": "x"}))
    assert read_config(tmp_path)["window_size"] == 0


def test_valid_vision_numbers_pass(tmp_path):
    assert _read(tmp_path, {"window_size": 112, "spatial_merge_size": 2})["vision_config"]["window_size"] == 112


@pytest.mark.parametrize("window", [1, 27])
def test_a_window_smaller_than_a_merged_patch_is_refused_naming_it(window):
    with pytest.raises(CheckpointError, match=r"vision_config\.window_size .* smaller than a merged patch"):
        vision_architecture({"patch_size": 14, "spatial_merge_size": 2, "window_size": window}, QWEN2_5_VL)


def test_a_window_of_one_merged_patch_is_served():
    assert vision_architecture({"patch_size": 14, "spatial_merge_size": 2, "window_size": 28}).window_size == 28


@pytest.mark.parametrize("family, key", [(QWEN2_5_VL, "window_size"), (QWEN2_5_VL, "depth"),
                                         (QWEN3_VL, "spatial_merge_size"), (QWEN3_VL, "num_position_embeddings")])
def test_a_null_vision_number_is_refused_naming_it(family, key):
    with pytest.raises(CheckpointError, match=rf"vision_config\.{key} is null"):
        vision_architecture({key: None}, family)
