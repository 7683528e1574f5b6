"""A vision-language config.json that leaves keys out reads as transformers reads it: its config
classes fill each missing key with their default (Qwen2.5-VL's full-attention encoder blocks
[7, 15, 23, 31] and decoder rms_norm_eps 1e-5, Qwen3-VL's DeepStack blocks, the image sentinel ids),
so the recipe prepares the model transformers loads from the same file, not another one; the head is
tied where transformers ties it. An encoder whose temporal patch size is not the 2 frames the served
image preparation fills is refused at prepare (its patches would have the wrong width at the first
image)."""

from __future__ import annotations

import copy
import functools

import pytest

from helios.ignition.architecture import CheckpointError
from helios.ignition.recipes import qwen_vl
from helios.ignition.recipes.base import UnsupportedCheckpoint
from helios.ignition.recipes.vision import QWEN2_5_VL, QWEN3_VL, vision_architecture

from .test_vl_equivalence import _Tensors
from .tiny_vl import tiny_model
from .tiny_vl3 import tiny_model3

_VISION_CLASSES = {QWEN2_5_VL: "Qwen2_5_VLVisionConfig", QWEN3_VL: "Qwen3VLVisionConfig"}
_FAMILIES = [(tiny_model, "Qwen2_5_VLForConditionalGeneration"), (tiny_model3, "Qwen3VLForConditionalGeneration")]


@functools.cache
def _checkpoint(factory):
    """The tiny model's config class, config dict (copied by each test) and tensors, built once."""
    model = factory()
    return type(model.config), model.config.to_dict(), _Tensors(model.state_dict())


def _reference_vision(family: str, config: dict) -> dict:
    import transformers

    return getattr(transformers, _VISION_CLASSES[family])(**config).to_dict()


@pytest.mark.parametrize("config", [
    {},
    {"depth": 25, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64},
    {"depth": 25, "hidden_size": 32, "num_heads": 2, "fullatt_block_indexes": [2], "window_size": 56},
], ids=["empty", "no-block-lists", "listed"])
@pytest.mark.parametrize("family", [QWEN2_5_VL, QWEN3_VL])
def test_a_terse_vision_config_reads_as_transformers_reads_it(family, config):
    """Missing keys were read as no full-attention blocks (every Qwen2.5-VL block windowed, where
    transformers attends over the whole image in blocks 7, 15, ...) and no DeepStack blocks, or refused."""
    assert vision_architecture(config, family) == vision_architecture(_reference_vision(family, config), family)


@pytest.mark.parametrize("factory, source", _FAMILIES, ids=["qwen2_5_vl", "qwen3_vl"])
def test_a_terse_checkpoint_config_prepares_the_model_transformers_loads(factory, source):
    config_class, config, tensors = _checkpoint(factory)
    config = copy.deepcopy(config)
    del config["text_config"]["rms_norm_eps"], config["image_token_id"], config["vision_end_token_id"]
    config["vision_config"].pop("fullatt_block_indexes", None)
    reference = config_class(**config)
    recipe = qwen_vl.build(source, config, tensors, "float32")
    assert recipe.text.architecture.rms_norm_eps == reference.text_config.rms_norm_eps  # Qwen2.5-VL: 1e-5, not 1e-6
    assert (recipe.image_token_id, recipe.vision_end_id) == (reference.image_token_id, reference.vision_end_token_id)
    assert recipe.vision == vision_architecture(reference.vision_config.to_dict(), recipe.vision.family)


@pytest.mark.parametrize("family", [QWEN2_5_VL, QWEN3_VL])
def test_an_encoder_of_another_temporal_patch_size_is_refused(family):
    with pytest.raises(UnsupportedCheckpoint, match="temporal_patch_size 1 is not supported"):
        vision_architecture({"temporal_patch_size": 1}, family)


@pytest.mark.parametrize("top, text", [(False, True), (True, False), (None, True)], ids=["text-only", "top-only",
                                                                                       "text-without-top"])
@pytest.mark.parametrize("factory, source", _FAMILIES, ids=["qwen2_5_vl", "qwen3_vl"])
def test_the_head_is_tied_where_transformers_ties_it(factory, source, top, text):
    """transformers ties by the top-level flag, which a text_config's true turns on for Qwen2.5-VL only;
    the text_config's own value won (a Qwen3-VL head tied there alone read the embeddings, not lm_head)."""
    config_class, config, tensors = _checkpoint(factory)
    config = copy.deepcopy(config)
    config.pop("tie_word_embeddings", None)
    if top is not None:
        config["tie_word_embeddings"] = top
    config["text_config"]["tie_word_embeddings"] = text
    recipe = qwen_vl.build(source, config, tensors, "float32")
    assert recipe.text.architecture.tie_word_embeddings == config_class(**config).tie_word_embeddings


@pytest.mark.parametrize("key, value", [("image_token_id", 10**12), ("vision_start_token_id", -5),
                                        ("vision_end_token_id", 151936), ("image_token_id", "151655"),
                                        ("image_token_id", None)],
                         ids=["past-32-bits", "negative", "past-the-vocabulary", "string", "null"])
def test_an_image_sentinel_id_outside_the_vocabulary_is_refused_naming_it(key, value):
    """transformers finds an image's tokens by these ids, which the prompt's never equal (a null fails
    there). One outside the contract's 32-bit ids crashed prepare with a traceback (a protobuf
    ValueError as the contract was written), one past the vocabulary was refused after every capture."""
    _, config, tensors = _checkpoint(tiny_model)
    config = {**copy.deepcopy(config), key: value}
    with pytest.raises(CheckpointError, match=f"config.json: {key} must be a token id below the vocab_size 151936, "
                                              f"got {value!r}"):
        qwen_vl.build("Qwen2_5_VLForConditionalGeneration", config, tensors, "float32")


@pytest.mark.parametrize("factory, source, stored, patch", [(*_FAMILIES[0], 14, 16), (*_FAMILIES[1], 16, 14)],
                         ids=["qwen2_5_vl", "qwen3_vl"])
def test_a_patch_embedding_of_another_patch_geometry_is_refused_naming_it(factory, source, stored, patch):
    """transformers refuses to load a patch embedding whose shape is not the config's patch geometry;
    its flattened columns were taken as a patch's pixels, and capture failed with a traceback."""
    _, config, tensors = _checkpoint(factory)
    config = copy.deepcopy(config)
    config["vision_config"]["patch_size"] = patch
    with pytest.raises(CheckpointError, match=f"tensor model.visual.patch_embed.proj.weight is \\[32, 3, 2, {stored}, "
                                              f"{stored}\\], not \\[32, 3, 2, {patch}, {patch}\\]"):
        qwen_vl.build(source, config, tensors, "float32")


@pytest.mark.parametrize("family", [QWEN2_5_VL, QWEN3_VL])
def test_an_encoder_of_other_than_three_channels_is_refused(family):
    """The served image preparation makes RGB patches; an encoder of one channel failed capture."""
    with pytest.raises(UnsupportedCheckpoint, match="vision in_channels 1 is not supported"):
        vision_architecture({"in_channels": 1}, family)
