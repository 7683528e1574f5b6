"""A tiny random Qwen2.5-VL checkpoint and test images, built with transformers' config classes."""

from __future__ import annotations

import io

import numpy as np

IMAGE_TOKEN, VISION_START, VISION_END = 151655, 151652, 151653
VOCAB = 151936
MIN_PIXELS, MAX_PIXELS = 28 * 28 * 4, 28 * 28 * 20
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)


def tiny_model():
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    config = Qwen2_5_VLConfig(
        text_config=dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                         tie_word_embeddings=False),
        vision_config=dict(depth=3, hidden_size=32, num_heads=2, intermediate_size=64, patch_size=14,
                           temporal_patch_size=2, spatial_merge_size=2, window_size=56, out_hidden_size=64,
                           fullatt_block_indexes=[1]),
        image_token_id=IMAGE_TOKEN, vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=False)
    config._attn_implementation = "sdpa"
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger random weights, so greedy tokens depend on the images
        for param in model.parameters():
            param.normal_(0.0, 0.08)
    return model


def image_bytes(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 255, size=(height // 8 + 1, width // 8 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(base).resize((width, height), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    image.save(out, format=fmt)
    return out.getvalue()


def hf_image_processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, image_mean=list(MEAN),
                                    image_std=list(STD))
