"""Drawn configurations of the dense families added with EXAONE 4 (EXAONE 4, Apertus, Arcee, Nemotron, StableLM,
GPT-NeoX, GLM v1, Helium, Ministral, Ministral 3, OLMo v1, VaultGemma): each matches transformers in float32
(test_config_fuzz's check: prefill logits, scored log-probabilities, greedy tokens and their logits) or is refused
naming a drawn setting. The suite draws one seed per family; HELIOS_DENSE_FUZZ_SEEDS=N draws N.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest
import transformers

from .hf_checkpoints import Family
from .test_config_fuzz import Variant, _attention_geometry, _choice, _draw_partial_rotary, _legacy_rope, _rope, \
    check_variant

_LLAMA_ROPES = ("default", "default", "linear", "llama3", "yarn", "dynamic")


def _base(rng: random.Random, explicit_head_dim: bool = False) -> dict:
    return dict(num_hidden_layers=_choice(rng, (2, 3)), vocab_size=_choice(rng, (97, 128)),
                intermediate_size=_choice(rng, (32, 48)), max_position_embeddings=_choice(rng, (64, 512)),
                tie_word_embeddings=rng.random() < 0.4, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                **_attention_geometry(rng, explicit_head_dim))


def _variant(name: str, seed: int, cls, config: dict, rng: random.Random, legacy: bool = True) -> Variant:
    rope = config.get("rope_parameters")
    return Variant(Family(f"{name}-{seed}", cls, tuple(config.items())),
                   _legacy_rope(rng, rope) if legacy and rope else (), rng.random() < 0.3)


def _head_dim(config: dict) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def draw_exaone4(seed: int) -> Variant:
    """Sliding and global layers by layer_types or sliding_window_pattern (rarely a string: refused), windows
    under and over the prompt or null (global layers rotate then), Llama's rope types, an explicit head_dim."""
    rng = random.Random(seed)
    config = _base(rng, explicit_head_dim=True)
    layers = config["num_hidden_layers"]
    config["sliding_window"] = _choice(rng, (None, 3, 5, 4096))
    pattern = _choice(rng, (1, 2, 3, 4, "LLG" if rng.random() < 0.2 else 2))
    if config["sliding_window"] is None or isinstance(pattern, str) or rng.random() < 0.4:
        kinds = ("full_attention",) if config["sliding_window"] is None and rng.random() < 0.9 else \
            ("sliding_attention", "full_attention")
        config["layer_types"] = [_choice(rng, kinds) for _ in range(layers)]
    if not isinstance(pattern, str) or "layer_types" in config:
        config["sliding_window_pattern"] = pattern
    config["rope_parameters"] = _rope(rng, _LLAMA_ROPES, _head_dim(config))
    return _variant("exaone4", seed, transformers.Exaone4Config, config, rng)


def _plain_mlp(name: str, cls, default: str, seed: int) -> Variant:
    rng = random.Random(seed)
    config = _base(rng)
    config.update(attention_bias=rng.random() < 0.4, mlp_bias=rng.random() < 0.4,
                  hidden_act=_choice(rng, (default, default, "relu2", "silu", "gelu", "gelu_pytorch_tanh",
                                           "relu" if rng.random() < 0.3 else default)))
    rope = config["rope_parameters"] = _rope(rng, _LLAMA_ROPES, _head_dim(config))
    # ApertusConfig reads a legacy top-level rope_theta without rope_scaling as no rope settings (its llama3
    # default): the legacy spelling of a default rope is another model there
    return _variant(name, seed, cls, config, rng, legacy=rope["rope_type"] != "default" or cls is not
                    transformers.ApertusConfig)


def draw_apertus(seed: int) -> Variant:
    """xIELU mostly (relu2, silu, GELUs; rarely relu: refused), q/k/v/o biases or none, Llama's rope types."""
    return _plain_mlp("apertus", transformers.ApertusConfig, "xielu", seed)


def draw_arcee(seed: int) -> Variant:
    """relu^2 mostly (silu, GELUs; rarely relu: refused), biases, Llama's rope types."""
    return _plain_mlp("arcee", transformers.ArceeConfig, "relu2", seed)


def draw_nemotron(seed: int) -> Variant:
    """LayerNorm1P, relu^2 (rarely another), biases, partial rotary drawn, norm_eps, an explicit head_dim."""
    rng = random.Random(seed)
    config = _base(rng, explicit_head_dim=True)
    config.update(attention_bias=rng.random() < 0.4, mlp_bias=rng.random() < 0.4,
                  norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)))
    if rng.random() < 0.2:
        config["hidden_act"] = _choice(rng, ("silu", "gelu", "relu"))
    rope = _rope(rng, _LLAMA_ROPES, config["head_dim"])
    _draw_partial_rotary(rng, rope, config["head_dim"])
    config["rope_parameters"] = rope
    return _variant("nemotron", seed, transformers.NemotronConfig, config, rng)


def _layer_norm_geometry(rng: random.Random) -> dict:
    config = _base(rng)
    config.pop("head_dim", None)  # heads are hidden_size / heads wide in these references
    if (config["hidden_size"] // config["num_attention_heads"]) % 2:
        config["hidden_size"] = 16 * config["num_attention_heads"]
    config["layer_norm_eps"] = _choice(rng, (1e-6, 1e-5, 0.1))
    return config


def draw_stablelm(seed: int) -> Variant:
    """The parallel residual or not, per-head q/k LayerNorms or not, q/k/v biases, partial rotary drawn."""
    rng = random.Random(seed)
    config = _layer_norm_geometry(rng)
    config.update(use_parallel_residual=rng.random() < 0.5, qk_layernorm=rng.random() < 0.5,
                  use_qkv_bias=rng.random() < 0.5)
    rope = _rope(rng, ("default", "default", "linear"), _head_dim(config))  # (dynamic: the reference breaks)
    _draw_partial_rotary(rng, rope, _head_dim(config))
    config["rope_parameters"] = rope
    return _variant("stablelm", seed, transformers.StableLmConfig, config, rng, legacy=False)


def draw_gpt_neox(seed: int) -> Variant:
    """The parallel residual or not, GELU (exact, tanh spellings; rarely relu: refused), attention biases or
    none, partial rotary drawn (sometimes in the legacy rotary_pct / rotary_emb_base spelling)."""
    rng = random.Random(seed)
    config = _layer_norm_geometry(rng)
    config.pop("num_key_value_heads")
    config.update(use_parallel_residual=rng.random() < 0.6, attention_bias=rng.random() < 0.7,
                  hidden_act=_choice(rng, ("gelu", "gelu", "gelu_new", "gelu_fast", "relu" if rng.random() < 0.3
                                           else "gelu")))
    rope = _rope(rng, ("default", "default", "linear"), _head_dim(config))  # (dynamic: the reference breaks)
    _draw_partial_rotary(rng, rope, _head_dim(config))
    config["rope_parameters"] = rope
    variant = _variant("gpt_neox", seed, transformers.GPTNeoXConfig, config, rng, legacy=False)
    if rope["rope_type"] == "default" and rng.random() < 0.5:  # Pythia's spelling
        legacy = {"rope_parameters": None, "rotary_emb_base": rope.get("rope_theta", 10000),
                  "rotary_pct": rope.get("partial_rotary_factor", 0.25)}
        variant = dataclasses.replace(variant, legacy=tuple(legacy.items()))
    return variant


def draw_olmo1(seed: int) -> Variant:
    """Parameter-free LayerNorms, clip_qkv null or drawn (rarely 0: refused), biases, Llama's rope types."""
    rng = random.Random(seed)
    config = _base(rng)
    config.update(attention_bias=rng.random() < 0.4,
                  clip_qkv=_choice(rng, (None, 0.5, 2.0, 8.0, 0.0 if rng.random() < 0.2 else None)))
    config["rope_parameters"] = _rope(rng, _LLAMA_ROPES, _head_dim(config))
    return _variant("olmo1", seed, transformers.OlmoConfig, config, rng)


def draw_ministral(seed: int) -> Variant:
    """layer_types or the every-layer default, windows under and over the prompt (a null one breaks the
    reference's own forward), Llama's rope types, an explicit head_dim."""
    rng = random.Random(seed)
    config = _base(rng, explicit_head_dim=True)
    config["sliding_window"] = _choice(rng, (3, 5, 4096))
    if rng.random() < 0.5:
        config["layer_types"] = [_choice(rng, ("sliding_attention", "full_attention"))
                                 for _ in range(config["num_hidden_layers"])]
    config["rope_parameters"] = _rope(rng, _LLAMA_ROPES, config["head_dim"])
    return _variant("ministral", seed, transformers.MinistralConfig, config, rng)


def draw_helium_glm(seed: int) -> Variant:
    """Helium (interleaved whole-head rotary, biases) or GLM v1 (interleaved partial rotary drawn, q/k/v
    biases), an explicit head_dim, Llama's rope types."""
    rng = random.Random(seed)
    config = _base(rng, explicit_head_dim=True)
    config["attention_bias"] = rng.random() < 0.6
    rope = _rope(rng, _LLAMA_ROPES, config["head_dim"])
    if rng.random() < 0.5:
        config["mlp_bias"] = rng.random() < 0.4
        config["rope_parameters"] = rope
        return _variant("helium", seed, transformers.HeliumConfig, config, rng)
    _draw_partial_rotary(rng, rope, config["head_dim"])
    config["rope_parameters"] = rope
    return _variant("glm", seed, transformers.GlmConfig, config, rng)


DRAWS = {"exaone4": draw_exaone4, "apertus": draw_apertus, "arcee": draw_arcee, "nemotron": draw_nemotron,
         "stablelm": draw_stablelm, "gpt_neox": draw_gpt_neox, "olmo1": draw_olmo1, "ministral": draw_ministral,
         "helium_glm": draw_helium_glm}
_SEEDS = range(int(os.environ.get("HELIOS_DENSE_FUZZ_SEEDS", 1)))  # the variable: a wider sweep


@pytest.mark.parametrize("kind, seed", [(kind, seed) for kind in DRAWS for seed in _SEEDS], ids=str)
def test_a_drawn_dense_configuration_matches_the_reference_or_is_refused_by_name(tmp_path, kind, seed):
    print(kind, seed, check_variant(DRAWS[kind](seed), tmp_path))
