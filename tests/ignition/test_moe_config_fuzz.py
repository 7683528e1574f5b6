"""test_config_fuzz's differential check over drawn Llama 4, MiniMax-M2, DBRX and PhiMoE configurations.

Each draw must prepare a model whose float32 prefill logits, scored log-probabilities and greedy
tokens equal transformers' on the same weights, or be refused with a `CheckpointError` naming one of
the drawn settings (`test_config_fuzz.check_variant`). The prompt (19 tokens and 6 greedy ones)
crosses the drawn attention chunks (3 to 16 positions) and the temperature floors (2 to 8 positions).
A few seeds per family run in the suite; HELIOS_MOE_CONFIG_FUZZ_SEEDS=N runs N (a wider sweep).
"""

from __future__ import annotations

import os
import random

import pytest
import transformers

from .hf_checkpoints import Family
from .test_config_fuzz import Variant, _attention_geometry, _choice, _legacy_rope, _rope, check_variant

_LLAMA_ROPES = ("default", "default", "linear", "llama3", "yarn")


def draw_llama4(seed: int) -> Variant:
    """Llama 4: 2-4 layers, NoPE layers by ``no_rope_layer_interval`` or drawn flags, chunked layers
    (``attention_chunk_size`` 3-16 or null), temperature tuning on or off (floor 2-8), q/k L2 norms on or
    off, sparse layers by ``interleave_moe_layer_step`` or a drawn ``moe_layers``, top-1 or top-2 of 2-4
    experts, q/k/v/o biases sometimes, tied or untied, Llama's rope types; sometimes the derived lists
    (``layer_types``, ``moe_layers``, ``no_rope_layers``) left out of config.json; rarely another
    activation (refused)."""
    rng = random.Random(f"llama4-{seed}")
    layers = _choice(rng, (2, 3, 4))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (16, 32)), intermediate_size_mlp=_choice(rng, (32, 48)),
                  max_position_embeddings=_choice(rng, (64, 512)), rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)),
                  num_local_experts=_choice(rng, (2, 4)), num_experts_per_tok=_choice(rng, (1, 1, 2)),
                  interleave_moe_layer_step=_choice(rng, (1, 2)), no_rope_layer_interval=_choice(rng, (2, 3, 4)),
                  attention_chunk_size=_choice(rng, (None, 3, 5, 8, 16)), attn_temperature_tuning=rng.random() < 0.7,
                  floor_scale=_choice(rng, (2, 4, 8)), attn_scale=_choice(rng, (0.1, 0.5)),
                  use_qk_norm=rng.random() < 0.7, attention_bias=rng.random() < 0.2,
                  tie_word_embeddings=rng.random() < 0.2, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng, explicit_head_dim=True))
    if rng.random() < 0.2:
        config["no_rope_layers"] = [rng.randrange(2) for _ in range(layers)]
    if rng.random() < 0.2:
        config["moe_layers"] = sorted(rng.sample(range(layers), _choice(rng, (1, layers))))
    if rng.random() < 0.04:
        config["hidden_act"] = "gelu"
    rope = _rope(rng, _LLAMA_ROPES, config["head_dim"])
    config["rope_parameters"] = rope
    legacy = _legacy_rope(rng, rope)
    if rng.random() < 0.3:  # as a hand-written config.json: the lists the config class derives left out
        legacy += tuple((key, None) for key in ("layer_types", "moe_layers", "no_rope_layers")
                        if key not in config)
    return Variant(Family(f"llama4-{seed}", transformers.Llama4TextConfig, tuple(config.items())), legacy)


def draw_minimax_m2(seed: int) -> Variant:
    """MiniMax-M2: an explicit head_dim, partial rotary by ``rotary_dim`` (legacy) or a factor, 4-8 experts
    top-1 to top-3 with a random correction bias, tied or untied, Llama's rope types; rarely an odd
    rotated width or another activation (refused)."""
    rng = random.Random(f"minimax_m2-{seed}")
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (16, 32)), max_position_embeddings=_choice(rng, (64, 512)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), num_local_experts=_choice(rng, (4, 6, 8)),
                  num_experts_per_tok=_choice(rng, (1, 2, 3)), tie_word_embeddings=rng.random() < 0.2,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None,
                  **_attention_geometry(rng, explicit_head_dim=True))
    head_dim = config["head_dim"]
    rotary = _choice(rng, (None, head_dim // 2, head_dim // 2, head_dim, 6 if head_dim > 8 else None))
    if rotary is not None and rotary % 2 == 0:
        config["rotary_dim"] = rotary
    if rng.random() < 0.04:
        config["hidden_act"] = "gelu"
    rope = _rope(rng, _LLAMA_ROPES, head_dim)
    if rng.random() < 0.05:
        rope["partial_rotary_factor"] = 0.3
    config["rope_parameters"] = rope
    return Variant(Family(f"minimax_m2-{seed}", transformers.MiniMaxM2Config, tuple(config.items())),
                   _legacy_rope(rng, rope))


def draw_dbrx(seed: int) -> Variant:
    """DBRX: heads dividing d_model, 1 to all key/value heads, ``clip_qkv`` null or 0.05-8, 2-4 experts
    top-1 or top-2, renormalised or not (rarely another power: refused), Llama's rope types (theta
    top-level, mirrored in ``attn_config`` as DBRX writes it; rarely another nested theta: refused)."""
    rng = random.Random(f"dbrx-{seed}")
    hidden, heads = _choice(rng, (32, 48, 64)), _choice(rng, (2, 4, 8))
    kv_heads = _choice(rng, [n for n in (1, 2, 4, 8) if heads % n == 0])
    experts = _choice(rng, (2, 4))
    rope = _rope(rng, ("default", "default", "linear", "llama3"), hidden // heads)
    theta = rope.setdefault("rope_theta", 10000.0)
    attn = {"kv_n_heads": kv_heads, "clip_qkv": _choice(rng, (None, 0.05, 0.5, 8.0)),
            "rope_theta": 500000.0 if rng.random() < 0.05 else theta}
    ffn = {"ffn_hidden_size": _choice(rng, (16, 32)), "moe_num_experts": experts,
           "moe_top_k": _choice(rng, (1, 2)), "moe_normalize_expert_weights": _choice(rng, (1.0, 1.0, None))}
    if rng.random() < 0.05:
        ffn["moe_normalize_expert_weights"] = 2.0
    config = dict(num_hidden_layers=2, n_layers=2, hidden_size=hidden, d_model=hidden, num_attention_heads=heads,
                  n_heads=heads, num_key_value_heads=kv_heads, vocab_size=_choice(rng, (97, 128, 131)),
                  max_position_embeddings=512, max_seq_len=512, attn_config=attn, ffn_config=ffn,
                  rope_parameters=rope, tie_word_embeddings=False, pad_token_id=None, bos_token_id=None,
                  eos_token_id=None)
    return Variant(Family(f"dbrx-{seed}", transformers.DbrxConfig, tuple(config.items())))


def draw_phimoe(seed: int) -> Variant:
    """PhiMoE: 2-6 experts (top-2 always; rarely another count: refused), a jitter threshold 0 to 0.5, q/k/v/o
    and lm_head biases or not, a sliding window or none, the default rope or Phi-3.5-MoE's longrope (short
    factors, equal mscales; rarely unequal: refused), tied or untied."""
    rng = random.Random(f"phimoe-{seed}")
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128, 131)),
                  intermediate_size=_choice(rng, (16, 32)),
                  max_position_embeddings=512, rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)),
                  num_local_experts=_choice(rng, (2, 4, 6)), router_jitter_noise=_choice(rng, (0.0, 0.01, 0.2, 0.5)),
                  attention_bias=rng.random() < 0.5, lm_head_bias=rng.random() < 0.5,
                  sliding_window=_choice(rng, (None, None, 5)), tie_word_embeddings=rng.random() < 0.2,
                  pad_token_id=None, bos_token_id=None, eos_token_id=None, **_attention_geometry(rng, True))
    if rng.random() < 0.05:
        config["num_experts_per_tok"] = 1
    half = config["head_dim"] // 2
    if rng.random() < 0.5:
        mscale = _choice(rng, (1.0, 1.2))
        config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": _choice(rng, (100.0, 10000.0)),
                                     "short_factor": [1.0 + 0.3 * i for i in range(half)], "long_factor": [2.0] * half,
                                     "short_mscale": mscale, "long_mscale": mscale if rng.random() < 0.9 else 1.5,
                                     "original_max_position_embeddings": 64}
    else:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": _choice(rng, (100.0, 10000.0))}
    return Variant(Family(f"phimoe-{seed}", transformers.PhimoeConfig, tuple(config.items())))


DRAWS = {"llama4": draw_llama4, "minimax_m2": draw_minimax_m2, "dbrx": draw_dbrx, "phimoe": draw_phimoe}
SEEDS = range(int(os.environ.get("HELIOS_MOE_CONFIG_FUZZ_SEEDS", 3)))


@pytest.mark.parametrize("kind, seed", [(kind, seed) for kind in DRAWS for seed in SEEDS],
                         ids=lambda value: str(value))
def test_a_drawn_configuration_matches_the_reference_or_is_refused_by_name(tmp_path, kind, seed):
    check_variant(DRAWS[kind](seed), tmp_path)
