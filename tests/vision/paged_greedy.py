"""Greedy generation through the prepared functions: the vision encoder at a patch capacity, then
the multimodal decoder over a paged cache (one prefill step, then one-token decode steps)."""

from __future__ import annotations

import torch

from helios.frontend.images.layout import VISION_OUTPUTS, ImagePrompt
from helios.ignition.decoder import PackedStep, lm_logits, slot_mapping
from helios.ignition.multimodal import multimodal_decoder_hidden
from helios.ignition.recipes.vision import vision_features

PAGE_TOKENS = 16


def vision_inputs(tensors: dict, device: str = "cpu") -> list[torch.Tensor]:
    return [torch.from_numpy(tensors[name]).to(device) for name in VISION_OUTPUTS]


def encode_images(recipe, tensors: dict, vision_fn=None) -> torch.Tensor:
    weights = {w.name: w.tensor for w in recipe.vision_weights}
    inputs = vision_inputs(tensors)
    if vision_fn is not None:
        return vision_fn(weights, *inputs)
    return vision_features(recipe.vision, weights, *inputs)


def greedy(recipe, prompt: ImagePrompt, features: torch.Tensor, steps: int) -> list[int]:
    """Greedy tokens; runs on the device of `features` (the weights are moved there)."""
    arch, device = recipe.text.architecture, features.device
    w = {name: tensor.to(device) for name, tensor in recipe.text_weights.items()}
    with torch.device(device):
        return _greedy(arch, w, prompt, features, steps)


def _greedy(arch, w, prompt: ImagePrompt, features: torch.Tensor, steps: int) -> list[int]:
    total = len(prompt.token_ids) + steps
    pages = (total + PAGE_TOKENS - 1) // PAGE_TOKENS
    shape = (arch.num_layers, pages, PAGE_TOKENS, arch.num_kv_heads, arch.head_dim)
    k_cache, v_cache = torch.zeros(shape, dtype=arch.torch_dtype), torch.zeros(shape, dtype=arch.torch_dtype)
    page_table = torch.arange(pages, dtype=torch.int32)[None, :]
    slots = torch.full((len(prompt.token_ids),), -1, dtype=torch.int64)
    slots[torch.from_numpy(prompt.feature_tokens).to(slots.device)] = torch.arange(len(prompt.feature_tokens))
    tokens = torch.tensor(prompt.token_ids, dtype=torch.int64)
    positions = torch.arange(len(tokens), dtype=torch.int64)
    rotary = torch.from_numpy(prompt.positions).to(features.device)
    out: list[int] = []
    for _ in range(steps):
        query_start = torch.tensor([0, len(tokens)], dtype=torch.int32)
        step = PackedStep(tokens, positions, query_start, page_table,
                          slot_mapping(query_start, page_table, positions, PAGE_TOKENS))
        with torch.no_grad():
            hidden = multimodal_decoder_hidden(arch, w, k_cache, v_cache, step, rotary, features, slots)
            token = int(lm_logits(arch, w, hidden[-1:]).argmax(-1))
        out.append(token)
        position = int(positions[-1]) + 1
        tokens, positions = torch.tensor([token]), torch.tensor([position])
        rotary = torch.full((1, 3), position + prompt.position_delta, dtype=torch.int64)
        slots = torch.tensor([-1])
    return out
