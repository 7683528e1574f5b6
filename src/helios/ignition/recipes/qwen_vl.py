"""Recipe for Qwen2_5_VLForConditionalGeneration and Qwen3VLForConditionalGeneration: the dense
Qwen2 (Qwen3: q/k norm) language model with multimodal rotary positions (Qwen3-VL: interleaved
mrope and DeepStack feature blocks), plus the vision encoder (`recipes.vision`).

Both checkpoint layouts are read: `model.language_model.*` / `model.visual.*` (current
transformers) and `model.*` / `visual.*` (the original releases). The language model's weights are
the Llama family's prepared layout (`llama.prepared_weights`); `rope.mrope_components` adds the
position component of each rotary frequency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch

from helios.ignition.architecture import CheckpointError
from helios.ignition.multimodal import mrope_components
from helios.ignition.recipes import llama
from helios.ignition.recipes.base import NamedWeight, Recipe, UnsupportedCheckpoint
from helios.ignition.recipes.vision import (QWEN2_5_VL, QWEN3_VL, VisionArchitecture, vision_architecture,
                                             vision_weights)

FAMILIES = {"Qwen2_5_VLForConditionalGeneration": QWEN2_5_VL, "Qwen3VLForConditionalGeneration": QWEN3_VL}
ARCHITECTURES = tuple(FAMILIES)
# Qwen2-VL's config.json spelling of the plain rope, "type": "mrope", which transformers' Qwen2.5-VL
# config reads as "default" (its Qwen3-VL config does not).
_MROPE_MEANS_DEFAULT = ("Qwen2_5_VLForConditionalGeneration",)
# The decoder's rope_theta where config.json gives none (transformers' text config class defaults).
_REFERENCE_THETA = {"Qwen2_5_VLForConditionalGeneration": 1000000.0, "Qwen3VLForConditionalGeneration": 500000.0}
# transformers' text config class defaults where the Llama recipe's own fallback differs: a terse
# Qwen2.5-VL config.json without rms_norm_eps prepared norms of epsilon 1e-6 (transformers: 1e-5).
_REFERENCE_TEXT = {"Qwen2_5_VLForConditionalGeneration": {"rms_norm_eps": 1e-5, "num_key_value_heads": 8},
                   "Qwen3VLForConditionalGeneration": {"num_key_value_heads": 32, "head_dim": 128}}
# Whose transformers config ties the head where only its text_config says so (`text_config`).
_TIED_BY_TEXT_CONFIG = ("Qwen2_5_VLForConditionalGeneration",)
# The image sentinels' ids where config.json gives none (both families' config class defaults).
_REFERENCE_TOKENS = {"image_token_id": 151655, "vision_start_token_id": 151652, "vision_end_token_id": 151653}


@dataclass(frozen=True)
class VisionLanguageRecipe:
    """The language model's recipe, its mrope frequency components, and the vision encoder's."""

    text: Recipe
    mrope_components: torch.Tensor
    vision: VisionArchitecture
    vision_weights: tuple[NamedWeight, ...]
    image_token_id: int
    vision_start_id: int
    vision_end_id: int

    @property
    def recipe(self) -> Recipe:
        """The prepared model: the decoder's weights, then the mrope table and the encoder's."""
        extra = (NamedWeight("rope.mrope_components", self.mrope_components), *self.vision_weights)
        return Recipe(self.text.source_architecture, self.text.architecture, self.text.weights, extra, self)

    @property
    def text_weights(self) -> dict[str, torch.Tensor]:
        weights = {w.name: w.tensor for w in self.text.weights}
        weights["rope.mrope_components"] = self.mrope_components
        return weights


class _TextTensors:
    """The language model's tensors under the names the Llama recipe reads."""

    def __init__(self, tensors, prefix: str):
        self._tensors, self._prefix = tensors, prefix
        self.used: set[str] = set()

    def _name(self, name: str) -> str:
        return self._prefix + name.removeprefix("model.") if name.startswith("model.") else name

    def __contains__(self, name: str) -> bool:
        return self._name(name) in self._tensors

    def get(self, name: str) -> torch.Tensor:
        self.used.add(self._name(name))
        return self._tensors.get(self._name(name))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._name(n) for n in self._tensors.names)


def text_config(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The decoder's settings: `text_config` (or the top level, the original releases' layout), its
    ``tie_word_embeddings`` as transformers resolves it: the top level's, which a text_config's true
    turns on for Qwen2.5-VL (a pre-v5 save's place for it) and never for Qwen3-VL (the text_config's
    own value won: a Qwen3-VL head tied there alone took the embeddings in place of lm_head.weight)."""
    text = dict(config.get("text_config") or config)
    tied = bool(config.get("tie_word_embeddings", False))
    if source in _TIED_BY_TEXT_CONFIG:
        tied = tied or bool(text.get("tie_word_embeddings", False))
    text["tie_word_embeddings"] = tied
    return text


def _token_id(config: Mapping[str, Any], key: str, default: int, vocab_size: int) -> int:
    """An image sentinel's id: an integer id of the vocabulary, which transformers compares the prompt's
    ids with (a string never matches, a null fails there); one outside the contract's 32-bit ids
    crashed prepare with a traceback as it was written into the contract, and one past the vocabulary
    was refused only after every program had been captured."""
    value = config.get(key, default)
    if type(value) is not int or not 0 <= value < vocab_size:
        raise CheckpointError(f"config.json: {key} must be a token id below the vocab_size {vocab_size}, "
                              f"got {value!r}")
    return value


def build(source: str, config: Mapping[str, Any], tensors, dtype: str | None) -> VisionLanguageRecipe:
    new_layout = "model.language_model.embed_tokens.weight" in tensors
    text_prefix, vision_prefix = ("model.language_model.", "model.visual.") if new_layout else ("model.", "visual.")
    text = {**_REFERENCE_TEXT[source], **text_config(config, source)}
    text.setdefault("rope_theta", _REFERENCE_THETA[source])
    params = llama.rope_settings(text)
    section = params.pop("mrope_section", None)
    interleaved = bool(params.pop("mrope_interleaved", False))
    if not section:
        raise UnsupportedCheckpoint(f"a {source} checkpoint needs rope mrope_section")
    if not isinstance(section, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                for n in section):
        raise UnsupportedCheckpoint(f"rope mrope_section must be a list of non-negative integers, got {section!r}")
    if source in _MROPE_MEANS_DEFAULT and params.get("rope_type", params.get("type")) == "mrope":
        params["rope_type"] = "default"
    if params.get("rope_type", params.get("type")) == "yarn":  # the mrope tables have no attention factor
        raise UnsupportedCheckpoint(f"rope_type 'yarn' is not supported with mrope_section ({source})")
    text["rope_parameters"], text["rope_scaling"] = params, None  # the mrope keys read, the rest for the decoder
    view = _TextTensors(tensors, text_prefix)
    arch = llama.architecture_from_config(source, text, view, dtype)
    if sum(section) * 2 != arch.head_dim:
        raise UnsupportedCheckpoint(f"mrope_section {section} does not cover head_dim {arch.head_dim}")
    weights, _ = llama.prepared_weights(arch, text, view)
    vision = vision_architecture(config.get("vision_config") or {}, FAMILIES[source])
    if vision.out_hidden_size != arch.hidden_size:
        raise UnsupportedCheckpoint(f"vision out_hidden_size {vision.out_hidden_size} is not the decoder's "
                                    f"hidden_size {arch.hidden_size}")
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        return tensors.get(name).to(arch.torch_dtype)

    visual = tuple(vision_weights(vision, take, vision_prefix))
    unplaced = sorted(set(tensors.names) - used - view.used - {"lm_head.weight"})
    if unplaced:
        raise UnsupportedCheckpoint(f"{source} checkpoint has tensors this recipe does not use: {unplaced[:8]}")
    image, start, end = (_token_id(config, key, default, arch.vocab_size) for key, default in _REFERENCE_TOKENS.items())
    return VisionLanguageRecipe(Recipe(source, arch, weights), mrope_components(section, interleaved), vision, visual,
                                image, start, end)
