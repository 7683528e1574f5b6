"""test_config_fuzz's differential check over drawn Granite 4.0, Nemotron-H and Falcon-H1 configurations.

Each draw must prepare a model whose float32 prefill logits and greedy tokens equal transformers' on
the same weights (the reference's greedy steps are full forwards, which apply ``time_step_limit`` as
the programs do), or be refused with a `CheckpointError` naming one of the drawn settings
(`test_config_fuzz.check_variant`). The 19-token prompt crosses the reference's Mamba2 chunk (8) and
the programs' prefill chunk. Two seeds per family run in the suite; HELIOS_HYBRID_FUZZ_SEEDS=N runs N
(a wider sweep).
"""

from __future__ import annotations

import os
import random

import pytest
import transformers

from .hf_checkpoints import Family
from .test_config_fuzz import Variant, _attention_geometry, _choice, check_variant

_LIMITS = ((0.0, float("inf")), (0.0, float("inf")), (0.01, 0.5))


def _mamba(rng: random.Random, hidden: int) -> dict:
    """Bamba-spelled Mamba2 settings: heads tiling mamba_expand x hidden (2 or 4), B/C groups, state,
    kernel, biases, a step limit."""
    return dict(mamba_n_heads=_choice(rng, (2, 4)), mamba_d_state=_choice(rng, (4, 8)),
                mamba_n_groups=_choice(rng, (1, 2)), mamba_d_conv=_choice(rng, (2, 4)), mamba_expand=2,
                mamba_chunk_size=8, mamba_conv_bias=rng.random() < 0.7, mamba_proj_bias=rng.random() < 0.3,
                time_step_limit=_choice(rng, _LIMITS))


def draw_granite_hybrid(seed: int) -> Variant:
    """Granite 4.0: 2-3 layers of Mamba2 mixers and attention (rarely every layer one kind: all mixers
    refused, all attention a plain decoder), the released or current kind names; experts (2-4, top-1/2)
    with the shared MLP, or the shared MLP alone (rarely neither: refused); rope, null or nope positions;
    every multiplier drawn; biases, tied or not; rarely partial rotary or another rope type (refused)."""
    rng = random.Random(f"granite_hybrid-{seed}")
    layers = _choice(rng, (2, 3))
    geometry = _attention_geometry(rng)
    geometry.pop("head_dim", None)  # GraniteMoeHybridConfig has no head_dim: heads are hidden / heads wide
    if (geometry["hidden_size"] // geometry["num_attention_heads"]) % 2:
        geometry["num_attention_heads"] = geometry["num_key_value_heads"] = 2
    kinds = [_choice(rng, ("mamba", "attention")) for _ in range(layers)]
    if rng.random() < 0.9 and len(set(kinds)) == 1:
        kinds[rng.randrange(layers)] = "attention" if kinds[0] == "mamba" else "mamba"
    if rng.random() < 0.5:
        kinds = ["linear_attention" if kind == "mamba" else "full_attention" for kind in kinds]
    experts = _choice(rng, (0, 0, 2, 4))
    config = dict(num_hidden_layers=layers, vocab_size=_choice(rng, (97, 128)), layer_types=kinds,
                  num_local_experts=experts, num_experts_per_tok=_choice(rng, (1, 2)) if experts else 1,
                  intermediate_size=_choice(rng, (16, 32)),
                  shared_intermediate_size=_choice(rng, (32, 48)) if rng.random() < 0.95 else 0,
                  position_embedding_type=_choice(rng, ("rope", None, "nope")),
                  rope_parameters={"rope_type": "default", "rope_theta": _choice(rng, (100.0, 10000.0))},
                  embedding_multiplier=_choice(rng, (1.0, 4.0, 12.0)),
                  attention_multiplier=_choice(rng, (0.0625, 0.2, 1.0)),
                  residual_multiplier=_choice(rng, (0.22, 0.5, 1.0)), logits_scaling=_choice(rng, (1.0, 2.5, 8.0)),
                  rms_norm_eps=_choice(rng, (1e-6, 1e-5, 0.1)), attention_bias=rng.random() < 0.3,
                  tie_word_embeddings=rng.random() < 0.4, max_position_embeddings=512, **geometry,
                  **_mamba(rng, geometry["hidden_size"]))
    if rng.random() < 0.08:
        config["rope_parameters"] = _choice(rng, (
            {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5},
            {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}))
        config["position_embedding_type"] = "rope"
    return Variant(Family(f"granite_hybrid-{seed}", transformers.GraniteMoeHybridConfig, tuple(config.items())),
                   (), rng.random() < 0.3)


def draw_nemotron_h(seed: int) -> Variant:
    """Nemotron-H: 3-6 blocks of Mamba2 (M), attention (*), relu^2 MLP (-) and experts (E), mostly
    starting with a mixer (rarely an MLP first or in a row: refused), sometimes as the legacy
    ``hybrid_override_pattern``; 4-8 experts in 1-2 groups, top-1/2, renormalised or not, scaled,
    sometimes in a latent (``moe_latent_size``), the shared expert; Mamba2 heads whose width need not
    be a multiple of hidden, groups, state, kernel, biases, a step limit; an explicit head_dim; MLP
    biases (refused beside experts)."""
    rng = random.Random(f"nemotron_h-{seed}")
    blocks = [_choice(rng, "M*")]
    while len(blocks) < _choice(rng, (3, 4, 5, 6)):
        blocks.append(_choice(rng, "M*-E") if blocks[-1] in "M*" else _choice(rng, "M*M*" if rng.random() < 0.95
                                                                               else "-E"))
    if "*" not in blocks and rng.random() < 0.9:
        blocks[0] = "*"
    if "M" not in blocks and rng.random() < 0.9:
        blocks[-1 if blocks[-1] in "M*" else 0] = "M"
    if rng.random() < 0.05:
        blocks[0] = "-"
    pattern = "".join(blocks)
    kinds = [{"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}[c] for c in pattern]
    geometry = _attention_geometry(rng, explicit_head_dim=True)
    groups = _choice(rng, (1, 2))
    config = dict(vocab_size=_choice(rng, (97, 128)), layers_block_type=kinds, intermediate_size=_choice(rng, (32, 48)),
                  mamba_num_heads=_choice(rng, (2, 4)), mamba_head_dim=_choice(rng, (8, 12, 16)),
                  ssm_state_size=_choice(rng, (4, 8)), n_groups=groups, conv_kernel=_choice(rng, (2, 4)),
                  chunk_size=8, use_conv_bias=rng.random() < 0.7, use_bias=rng.random() < 0.3,
                  mlp_bias=rng.random() < 0.15, time_step_limit=_choice(rng, _LIMITS),
                  layer_norm_epsilon=_choice(rng, (1e-5, 0.1)), tie_word_embeddings=False,
                  n_routed_experts=_choice(rng, (4, 8)), num_experts_per_tok=_choice(rng, (1, 2)),
                  moe_intermediate_size=_choice(rng, (16, 32)),
                  moe_shared_expert_intermediate_size=_choice(rng, (16, 32)),
                  n_group=_choice(rng, (1, 2)), topk_group=1, norm_topk_prob=rng.random() < 0.7,
                  routed_scaling_factor=_choice(rng, (1.0, 2.5)), moe_latent_size=_choice(rng, (None, None, 16)),
                  **geometry)
    legacy = (("layers_block_type", None), ("hybrid_override_pattern", pattern)) if rng.random() < 0.3 else ()
    return Variant(Family(f"nemotron_h-{seed}", transformers.NemotronHConfig, tuple(config.items())), legacy,
                   rng.random() < 0.3)


def draw_falcon_h1(seed: int) -> Variant:
    """Falcon-H1: 2 layers of attention beside a Mamba2 mixer of ``mamba_d_ssm`` (or expand x hidden)
    width, gated and normed or not (rarely the norm before the gate: refused), every muP multiplier
    drawn, biases, tied or not, an explicit head_dim or none; rarely partial rotary (refused)."""
    rng = random.Random(f"falcon_h1-{seed}")
    geometry = _attention_geometry(rng)
    heads = _choice(rng, (2, 4))
    config = dict(num_hidden_layers=2, vocab_size=_choice(rng, (97, 128)), intermediate_size=_choice(rng, (32, 48)),
                  mamba_d_ssm=_choice(rng, (None, 16 * heads, 24 * heads)), mamba_n_heads=heads,
                  mamba_d_state=_choice(rng, (4, 8)), mamba_n_groups=_choice(rng, (1, 2)),
                  mamba_d_conv=_choice(rng, (2, 4)), mamba_expand=2, mamba_chunk_size=8,
                  mamba_conv_bias=rng.random() < 0.7, mamba_proj_bias=rng.random() < 0.3,
                  projectors_bias=rng.random() < 0.3, mamba_rms_norm=rng.random() < 0.5,
                  mamba_norm_before_gate=rng.random() < 0.1, time_step_limit=_choice(rng, _LIMITS),
                  attention_bias=rng.random() < 0.3, mlp_bias=rng.random() < 0.2,
                  rope_parameters={"rope_type": "default", "rope_theta": _choice(rng, (100.0, 10000.0))},
                  embedding_multiplier=_choice(rng, (1.0, 5.6)), lm_head_multiplier=_choice(rng, (1.0, 0.04)),
                  key_multiplier=_choice(rng, (1.0, 0.4)), attention_in_multiplier=_choice(rng, (1.0, 1.3)),
                  attention_out_multiplier=_choice(rng, (1.0, 0.9)), ssm_in_multiplier=_choice(rng, (1.0, 1.25)),
                  ssm_out_multiplier=_choice(rng, (1.0, 0.23)),
                  mlp_multipliers=[_choice(rng, (1.0, 0.88)), _choice(rng, (1.0, 0.59))],
                  ssm_multipliers=[_choice(rng, (1.0, 0.5, 1.4)) for _ in range(5)],
                  rms_norm_eps=_choice(rng, (1e-5, 0.1)), tie_word_embeddings=rng.random() < 0.3,
                  max_position_embeddings=512, **geometry)
    if rng.random() < 0.05:
        config["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}
    return Variant(Family(f"falcon_h1-{seed}", transformers.FalconH1Config, tuple(config.items())), (),
                   rng.random() < 0.3)


DRAWS = {"granite_hybrid": draw_granite_hybrid, "nemotron_h": draw_nemotron_h, "falcon_h1": draw_falcon_h1}
SEEDS = range(int(os.environ.get("HELIOS_HYBRID_FUZZ_SEEDS", 2)))  # the variable: a wider sweep


@pytest.mark.parametrize("kind, seed", [(kind, seed) for kind in DRAWS for seed in SEEDS],
                         ids=lambda value: str(value))
def test_a_drawn_hybrid_configuration_matches_the_reference_or_is_refused_by_name(tmp_path, kind, seed):
    check_variant(DRAWS[kind](seed), tmp_path)
