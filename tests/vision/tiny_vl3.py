"""A tiny random Qwen3-VL checkpoint (DeepStack, interleaved mrope, learned position grid), built
with transformers' config classes, and its image processor (16-pixel patches, mean/std 0.5)."""

from __future__ import annotations

from .tiny_vl import IMAGE_TOKEN, VISION_END, VISION_START, VOCAB

PATCH = 16
MIN_PIXELS, MAX_PIXELS = 32 * 32 * 4, 32 * 32 * 20
MEAN = STD = (0.5, 0.5, 0.5)


def tiny_model3():
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen3VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                          "mrope_interleaved": True},
                         tie_word_embeddings=False),
        vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=PATCH,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                           num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
        image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = Qwen3VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger random weights, so greedy tokens depend on the images
        for param in model.parameters():
            param.normal_(0.0, 0.08)
    return model


def hf_image_processor3():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, temporal_patch_size=2, min_pixels=MIN_PIXELS,
                                    max_pixels=MAX_PIXELS, image_mean=list(MEAN), image_std=list(STD))
