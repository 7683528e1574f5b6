"""Tiny random Hugging Face checkpoints on disk (config.json + model.safetensors), built with the
transformers config classes, and the reference models they came from.

Every parameter is re-drawn (norm weights around 1, non-zero biases, spread-out logits) so that
q/k/v biases, q/k norms and per-layer norms all matter, and greedy choices are not near-ties.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers

from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

_BASE = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=512)


@dataclass(frozen=True)
class Family:
    """One checkpoint family under test: a name, its config class and the overrides that shape it."""

    name: str
    config_class: type
    overrides: tuple[tuple[str, object], ...]

    def config(self):
        config = self.config_class(**{**_BASE, **dict(self.overrides)})
        config._attn_implementation = "eager"
        return config


LLAMA2 = Family("llama2", transformers.LlamaConfig, (
    ("num_key_value_heads", 4), ("attention_bias", True), ("mlp_bias", True), ("tie_word_embeddings", False),
))
LLAMA3 = Family("llama3", transformers.LlamaConfig, (
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
    ("tie_word_embeddings", True),
))
# Untied: the tiny random tied model only repeats a prompt's last token, so tests that compare a
# request's tokens across schedules (the stress) use this one, whose tokens depend on the history. Its own
# name: tests/parallel keys checkpoints and cores by name, and would otherwise hand it Llama 3's tied ones.
LLAMA3_UNTIED = Family("llama3_untied", transformers.LlamaConfig, (*LLAMA3.overrides[:-1], ("tie_word_embeddings", False)))
MISTRAL = Family("mistral", transformers.MistralConfig, (("sliding_window", 8), ("tie_word_embeddings", False)))
QWEN2 = Family("qwen2", transformers.Qwen2Config, (
    ("use_sliding_window", True), ("sliding_window", 6), ("max_window_layers", 1), ("tie_word_embeddings", True),
))
QWEN3 = Family("qwen3", transformers.Qwen3Config, (("head_dim", 32), ("tie_word_embeddings", False)))
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "original_max_position_embeddings": 64,
         "mscale": 0.9, "mscale_all_dim": 0.7, "beta_fast": 32, "beta_slow": 1}
# Multi-head latent attention, every layer dense (first_k_dense_replace = num_hidden_layers), queries
# projected directly (q_lora_rank None), YaRN rope with DeepSeek's mscale, interleaved rotary rows.
# Not in FAMILIES (DEEPSEEK covers dense layers): test_deepseek_recipe runs it eagerly.
DEEPSEEK_DENSE = Family("deepseek_dense", transformers.DeepseekV3Config, (
    ("num_key_value_heads", 4), ("q_lora_rank", None), ("kv_lora_rank", 32), ("qk_rope_head_dim", 16),
    ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("first_k_dense_replace", 2), ("rope_parameters", _YARN),
    ("tie_word_embeddings", False),
))
# Two dense then two mixture-of-experts layers: 8 routed experts in 4 groups (2 kept), top-3, a
# shared expert, a random routing correction bias; queries through the low-rank pair.
DEEPSEEK = Family("deepseek", transformers.DeepseekV3Config, (
    ("num_hidden_layers", 4), ("num_key_value_heads", 4), ("q_lora_rank", 24), ("kv_lora_rank", 32),
    ("qk_rope_head_dim", 16), ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("first_k_dense_replace", 2),
    ("n_routed_experts", 8), ("num_experts_per_tok", 3), ("n_group", 4), ("topk_group", 2),
    ("moe_intermediate_size", 32), ("n_shared_experts", 1), ("rope_parameters", _YARN), ("tie_word_embeddings", False),
))
# DeepSeek-V2 (tests/ignition/test_deepseek_v2_recipe.py): one dense then two sparse layers; 8 routed experts
# in 4 groups scored by their best expert (2 kept), top-3, softmax weights scaled by 2.5 and never
# renormalised, two shared experts; queries through the low-rank pair; YaRN with DeepSeek's mscale; the
# rotary rows interleaved (V2 always is).
DEEPSEEK_V2 = Family("deepseek_v2", transformers.DeepseekV2Config, (
    ("num_hidden_layers", 3), ("num_key_value_heads", 4), ("q_lora_rank", 24), ("kv_lora_rank", 32),
    ("qk_rope_head_dim", 16), ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("first_k_dense_replace", 1),
    ("n_routed_experts", 8), ("num_experts_per_tok", 3), ("topk_method", "group_limited_greedy"), ("n_group", 4),
    ("topk_group", 2), ("moe_intermediate_size", 32), ("n_shared_experts", 2), ("routed_scaling_factor", 2.5),
    ("rope_parameters", _YARN), ("tie_word_embeddings", False),
))
# DeepSeek-V2-Lite's shape: queries projected directly (q_lora_rank None), greedy top-2 of 6 experts, one
# dense layer, the default rope (a small theta: every pair turns within the prompts).
DEEPSEEK_V2_LITE = Family("deepseek_v2_lite", transformers.DeepseekV2Config, (
    ("num_key_value_heads", 4), ("q_lora_rank", None), ("kv_lora_rank", 32), ("qk_rope_head_dim", 16),
    ("qk_nope_head_dim", 16), ("v_head_dim", 16), ("first_k_dense_replace", 1), ("n_routed_experts", 6),
    ("num_experts_per_tok", 2), ("topk_method", "greedy"), ("moe_intermediate_size", 32), ("n_shared_experts", 1),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), ("tie_word_embeddings", False),
))
# GLM-4.7-Flash (Glm4MoeLiteForCausalLM): DeepSeek-V3's dataflow with sparse layers by mlp_layer_types (here
# sparse, dense, sparse), sigmoid routing with the correction bias in 2 groups, a shared expert.
GLM4_MOE_LITE = Family("glm4_moe_lite", transformers.Glm4MoeLiteConfig, (
    ("num_hidden_layers", 3), ("num_key_value_heads", 4), ("q_lora_rank", 24), ("kv_lora_rank", 32),
    ("qk_rope_head_dim", 16), ("qk_nope_head_dim", 16), ("v_head_dim", 24),
    ("mlp_layer_types", ["sparse", "dense", "sparse"]), ("n_routed_experts", 8), ("num_experts_per_tok", 3),
    ("n_group", 2), ("topk_group", 1), ("moe_intermediate_size", 32), ("n_shared_experts", 1),
    ("routed_scaling_factor", 1.8), ("rope_parameters", _YARN), ("tie_word_embeddings", False),
))
LATENT_FAMILIES = (DEEPSEEK_V2, DEEPSEEK_V2_LITE, GLM4_MOE_LITE)
# Youtu-LLM (tests/ignition/test_youtu_recipe.py): DeepSeek-V3's latent attention with a dense MLP in every
# layer, queries through the low-rank pair, YaRN with DeepSeek's mscale, tied embeddings (YoutuConfig's default).
YOUTU = Family("youtu", transformers.YoutuConfig, (
    ("num_key_value_heads", 4), ("q_lora_rank", 24), ("kv_lora_rank", 32), ("qk_rope_head_dim", 16),
    ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("rope_parameters", _YARN), ("tie_word_embeddings", True),
    ("bos_token_id", None), ("eos_token_id", None),
))
# dots.llm1 (tests/ignition/test_dots1_recipe.py): Qwen3's per-head q/k norms with q/k/v/o biases, a dense
# then two sparse layers (DeepSeek-V3's sigmoid routing: 8 experts in 2 groups, 1 kept, top-3, a
# correction bias, renormalised and scaled), a shared expert; the last layer sliding over 5 positions.
DOTS1 = Family("dots1", transformers.Dots1Config, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("attention_bias", True), ("first_k_dense_replace", 1),
    ("n_routed_experts", 8), ("num_experts_per_tok", 3), ("n_group", 2), ("topk_group", 1),
    ("moe_intermediate_size", 32), ("n_shared_experts", 1), ("norm_topk_prob", True), ("routed_scaling_factor", 2.0),
    ("sliding_window", 5), ("max_window_layers", 2), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
# Mixture-of-experts families: several experts, top-k > 1, two layers of each kind a family mixes.
QWEN3_MOE = Family("qwen3_moe", transformers.Qwen3MoeConfig, (
    ("head_dim", 32), ("num_hidden_layers", 4), ("mlp_only_layers", [0, 2]), ("num_experts", 8),
    ("num_experts_per_tok", 3), ("moe_intermediate_size", 48), ("norm_topk_prob", True),
    ("tie_word_embeddings", False),
))
MIXTRAL = Family("mixtral", transformers.MixtralConfig, (
    ("num_local_experts", 6), ("num_experts_per_tok", 2), ("intermediate_size", 64), ("tie_word_embeddings", False),
))
GLM4_MOE = Family("glm4_moe", transformers.Glm4MoeConfig, (
    ("num_hidden_layers", 4), ("first_k_dense_replace", 2), ("n_routed_experts", 8), ("num_experts_per_tok", 3),
    ("n_group", 4), ("topk_group", 2), ("moe_intermediate_size", 32), ("n_shared_experts", 1),
    ("routed_scaling_factor", 2.5), ("norm_topk_prob", True), ("use_qk_norm", True), ("attention_bias", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}),
    ("tie_word_embeddings", False),
))
# gpt-oss: sliding, full, sliding, full layers; 4 experts, top-2; a small swiglu_limit so the clamps act
GPT_OSS = Family("gpt_oss", transformers.GptOssConfig, (
    ("num_hidden_layers", 4), ("head_dim", 16), ("intermediate_size", 32), ("num_local_experts", 4),
    ("num_experts_per_tok", 2), ("sliding_window", 6), ("swiglu_limit", 1.0), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64}),
))
MOE_FAMILIES = (QWEN3_MOE, MIXTRAL, GLM4_MOE)
DENSE_FAMILIES = (LLAMA2, LLAMA3, MISTRAL, QWEN2, QWEN3)
FAMILIES = DENSE_FAMILIES + MOE_FAMILIES + (DEEPSEEK, GPT_OSS)
# Phi3Config's (and SmolLM3Config's) token ids lie past the tiny vocabulary
PHI3_IDS = (("pad_token_id", None), ("bos_token_id", None), ("eos_token_id", None))
LONGROPE_SHORT = [1.0 + 0.05 * i for i in range(8)]
LONGROPE_LONG = [1.0 + 1.7 * i for i in range(8)]
PHI3_MINI = Family("phi3-mini", transformers.Phi3Config, (
    ("sliding_window", 6), ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default",
                                                                                "rope_theta": 10000.0}), *PHI3_IDS,
))
# Phi-3 (tests/ignition/test_phi3_recipe.py). Partial rotary: 12 of each head's 16 dims rotate (6 pairs); the
# original context outlasts every sequence of test_equivalence (14 prompt + 32 new tokens), so the reference keeps
# its short factors.
PHI4_MINI = Family("phi4-mini", transformers.Phi3Config, (
    ("partial_rotary_factor", 0.75), ("original_max_position_embeddings", 128), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": LONGROPE_SHORT[:6],
                         "long_factor": LONGROPE_LONG[:6]}), *PHI3_IDS,
))
# A short original context (16), for the long factors: attention factor sqrt(1 + ln 32 / ln 16) = 1.5.
PHI35_LONG = Family("phi3.5-long", transformers.Phi3Config, (
    ("original_max_position_embeddings", 16), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": LONGROPE_SHORT,
                         "long_factor": LONGROPE_LONG}), *PHI3_IDS,
))
PHI3_FAMILIES = (PHI3_MINI, PHI4_MINI)
# SmolLM3 (tests/ignition/test_smollm3_recipe.py): NoPE layers among rotary ones. Three layers, the middle one
# NoPE and sliding over 6 positions (the window SmolLM3Config derives for NoPE layers), untied; and tied, with
# q/k/v/o biases, llama3 rope and every third layer NoPE by no_rope_layer_interval.
SMOLLM3 = Family("smollm3", transformers.SmolLM3Config, (
    ("num_hidden_layers", 3), ("no_rope_layers", [1, 0, 1]), ("use_sliding_window", True), ("sliding_window", 6),
    ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0}), *PHI3_IDS,
))
SMOLLM3_TIED = Family("smollm3-tied", transformers.SmolLM3Config, (
    ("num_hidden_layers", 3), ("no_rope_layer_interval", 3), ("attention_bias", True), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 32}), *PHI3_IDS,
))
SMOLLM3_FAMILIES = (SMOLLM3, SMOLLM3_TIED)
# Seed-OSS (q/k/v bias without an o bias, head_dim 16 of hidden 64 / 8 heads) and Ernie 4.5 dense (biases on
# every projection, interleaved rotary pairs; a small theta turns every pair within the prompts), untied
# (tests/ignition/test_seed_oss_ernie_recipes.py).
SEED_OSS = Family("seed_oss", transformers.SeedOssConfig, (
    ("num_attention_heads", 8), ("head_dim", 16), ("attention_bias", True), ("attention_out_bias", False),
    ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default", "rope_theta": 10000.0}), *PHI3_IDS,
))
ERNIE4_5 = Family("ernie4_5", transformers.Ernie4_5Config, (
    ("head_dim", 16), ("use_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
LLAMA_SHAPED_FAMILIES = (SEED_OSS, ERNIE4_5)
# Hunyuan dense (tests/ignition/test_hunyuan_recipe.py): q/k norms after the rotation, NTK-alpha rope ("dynamic"
# with an alpha), q/k/v/o biases, head_dim 16 of hidden 64 / 8 heads, untied.
HUNYUAN = Family("hunyuan", transformers.HunYuanDenseV1Config, (
    ("num_attention_heads", 8), ("head_dim", 16), ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 1000.0}), *PHI3_IDS,
))
# Granite (tests/ignition/test_granite_recipe.py): every multiplier away from 1, q/k/v/o biases, untied.
GRANITE = Family("granite", transformers.GraniteConfig, (
    ("embedding_multiplier", 4.0), ("attention_multiplier", 0.2), ("residual_multiplier", 0.5), ("logits_scaling", 2.5),
    ("attention_bias", True), ("tie_word_embeddings", False), *PHI3_IDS,
))
# Gemma 3 text (tests/ignition/test_gemma3_recipe.py): sliding, full, sliding layers over a window of 5 (shorter
# than the prompts), local rope theta 100 against a linear-scaled global 10000 (factor 8), query_pre_attn_scalar
# 24 against head_dim 16, tied as released; and untied with q/k/v/o biases, a final logit soft cap and the legacy
# sliding_window_pattern (2: sliding, full).
GEMMA3 = Family("gemma3", transformers.Gemma3TextConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("sliding_window", 5), ("query_pre_attn_scalar", 24),
    ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]), ("tie_word_embeddings", True),
    ("rope_parameters", {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}),
))
GEMMA3_CAPPED = Family("gemma3-capped", transformers.Gemma3TextConfig, (
    ("head_dim", 16), ("sliding_window", 4), ("sliding_window_pattern", 2), ("query_pre_attn_scalar", 32),
    ("attention_bias", True), ("final_logit_softcapping", 10.0), ("tie_word_embeddings", False),
    ("rope_theta", 1000.0), ("rope_local_base_freq", 50.0),
))
GEMMA3_FAMILIES = (GEMMA3, GEMMA3_CAPPED)
# Gemma and Gemma 2 (tests/ignition/test_gemma_recipe.py). Gemma 1: head_dim 32 of hidden 64 / 4 heads, q/k/v/o
# biases, the legacy "gelu" activation name, tied. Gemma 2: sliding, full, sliding layers (Gemma2Config's default
# layer_types) over a window of 5, query_pre_attn_scalar 24 against head_dim 16, an attention soft cap of 2 (the
# scores here reach several times it) and a final logit cap of 12, untied.
GEMMA = Family("gemma", transformers.GemmaConfig, (
    ("head_dim", 32), ("attention_bias", True), ("hidden_act", "gelu"), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
GEMMA2 = Family("gemma2", transformers.Gemma2Config, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("sliding_window", 5), ("query_pre_attn_scalar", 24),
    ("attn_logit_softcapping", 2.0), ("final_logit_softcapping", 12.0), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
GEMMA_FAMILIES = (GEMMA, GEMMA2)
# GLM-4 dense (tests/ignition/test_glm4_recipe.py): sandwich norms, fused gate_up_proj, q/k/v biases, interleaved
# partial rotary (8 of each head's 16 dims; a small theta turns every pair within the prompts), untied.
GLM4 = Family("glm4", transformers.Glm4Config, (
    ("head_dim", 16), ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# OLMo 2 and OLMo 3 (tests/ignition/test_olmo_recipe.py): norms only after attention and MLP, q/k norms over the
# whole projections; OLMo 2 with q/k/v/o biases; OLMo 3 sliding, full, sliding layers over a window of 5 with a
# default local rope (theta 100) beside a linear-scaled global one; both untied.
OLMO2 = Family("olmo2", transformers.Olmo2Config, (
    ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
OLMO3 = Family("olmo3", transformers.Olmo3Config, (
    ("num_hidden_layers", 3), ("sliding_window", 5), ("tie_word_embeddings", False),
    ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]),
    ("rope_parameters", {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}}), *PHI3_IDS,
))
OLMO_FAMILIES = (OLMO2, OLMO3)
# Cohere (tests/ignition/test_cohere_recipe.py): LayerNorms, the parallel block, interleaved rotary over whole heads
# (theta 100 turns every pair within the prompts), per-head q/k LayerNorms, q/k/v/o biases, logit_scale 0.25 and
# tied embeddings as released; Cohere2 sliding, full, sliding layers over a window of 5 (its full layer rotates
# nothing), logit_scale 0.5, untied.
COHERE = Family("cohere", transformers.CohereConfig, (
    ("use_qk_norm", True), ("attention_bias", True), ("logit_scale", 0.25), ("layer_norm_eps", 1e-4),
    ("tie_word_embeddings", True), ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
COHERE2 = Family("cohere2", transformers.Cohere2Config, (
    ("num_hidden_layers", 3), ("sliding_window", 5), ("logit_scale", 0.5), ("tie_word_embeddings", False),
    ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
COHERE_FAMILIES = (COHERE, COHERE2)
# StarCoder2 (tests/ignition/test_starcoder2_recipe.py): LayerNorms with biases, the non-gated gelu_pytorch_tanh MLP
# (c_fc, c_proj) with biases, q/k/v/o biases, every layer sliding over a window of 5, theta 100, untied.
STARCODER2 = Family("starcoder2", transformers.Starcoder2Config, (
    ("sliding_window", 5), ("norm_epsilon", 1e-4), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
# Phi-2 (tests/ignition/test_phi2_recipe.py): LayerNorms with biases, the parallel block, the non-gated gelu_new MLP
# with biases, q/k/v/dense biases, partial rotary (8 of each head's 16 dims, theta 100), an lm_head bias, untied.
PHI2 = Family("phi2", transformers.PhiConfig, (
    ("layer_norm_eps", 1e-4), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# Qwen2-MoE (tests/ignition/test_qwen2_moe_recipe.py): sparse, dense, sparse layers (mlp_only_layers), 6 experts,
# top-2 unnormalised, a gated shared expert, q/k/v biases; the first layer slides over 5 positions (use_sliding_window
# below max_window_layers 2: Qwen2MoeConfig's every other layer), untied.
QWEN2_MOE = Family("qwen2_moe", transformers.Qwen2MoeConfig, (
    ("num_hidden_layers", 3), ("mlp_only_layers", [1]), ("num_experts", 6), ("num_experts_per_tok", 2),
    ("moe_intermediate_size", 32), ("shared_expert_intermediate_size", 48), ("use_sliding_window", True),
    ("sliding_window", 5), ("max_window_layers", 2), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
# OLMoE (tests/ignition/test_olmoe_recipe.py): q/k norms over the whole projections, a mixture of 6 experts in every
# layer, top-2; as released (no biases, unnormalised top-k, untied), and with q/k/v/o biases, renormalised top-3,
# one key/value head and tied embeddings.
OLMOE = Family("olmoe", transformers.OlmoeConfig, (
    ("num_experts", 6), ("num_experts_per_tok", 2), ("intermediate_size", 32), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
OLMOE_BIASED = Family("olmoe-biased", transformers.OlmoeConfig, (
    ("num_experts", 6), ("num_experts_per_tok", 3), ("intermediate_size", 32), ("norm_topk_prob", True),
    ("attention_bias", True), ("num_key_value_heads", 1), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0}), *PHI3_IDS,
))
OLMOE_FAMILIES = (OLMOE, OLMOE_BIASED)
# Granite MoE and Granite MoE Shared (tests/ignition/test_granite_moe_recipe.py): Granite's multipliers away from 1,
# a mixture in every layer weighted by the softmax of its top-k logits; 6 experts, top-2, q/k/v/o biases, untied; and
# 4 experts, top-3, a shared expert, tied.
_GRANITE_MULTIPLIERS = (("embedding_multiplier", 4.0), ("attention_multiplier", 0.2), ("residual_multiplier", 0.5),
                        ("logits_scaling", 2.5))
GRANITE_MOE = Family("granite_moe", transformers.GraniteMoeConfig, (
    *_GRANITE_MULTIPLIERS, ("num_local_experts", 6), ("num_experts_per_tok", 2), ("intermediate_size", 32),
    ("attention_bias", True), ("tie_word_embeddings", False), *PHI3_IDS,
))
GRANITE_MOE_SHARED = Family("granite_moe_shared", transformers.GraniteMoeSharedConfig, (
    *_GRANITE_MULTIPLIERS, ("num_local_experts", 4), ("num_experts_per_tok", 3), ("intermediate_size", 32),
    ("shared_intermediate_size", 48), ("tie_word_embeddings", True), *PHI3_IDS,
))
GRANITE_MOE_FAMILIES = (GRANITE_MOE, GRANITE_MOE_SHARED)
# Hunyuan MoE (tests/ignition/test_hunyuan_moe_recipe.py): Hunyuan dense's attention (q/k norms after the rotation,
# NTK-alpha rope, q/k/v/o biases, head_dim 16 of hidden 64 / 8 heads) with a mixture in every layer: 6 experts,
# top-2 renormalised, and the shared expert, all of width intermediate_size; untied.
HUNYUAN_MOE = Family("hunyuan_moe", transformers.HunYuanMoEV1Config, (
    ("num_attention_heads", 8), ("head_dim", 16), ("attention_bias", True), ("intermediate_size", 32),
    ("num_experts", 6), ("moe_topk", 2), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0, "rope_theta": 1000.0}), *PHI3_IDS,
    ("eod_token_id", None), ("sep_token_id", None),
))
# Ernie 4.5 MoE (tests/ignition/test_ernie4_5_moe_recipe.py): Ernie's interleaved rotary pairs (a small theta turns
# every pair within the prompts), a dense first layer then two sparse ones: 6 experts, top-2 of the softmax plus a
# random correction bias, renormalised, one shared expert; untied.
ERNIE4_5_MOE = Family("ernie4_5_moe", transformers.Ernie4_5_MoeConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("moe_num_experts", 6), ("moe_k", 2), ("moe_intermediate_size", 32),
    ("moe_num_shared_experts", 1), ("moe_layer_start_index", 1), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
# A hybrid decoder: Mamba2 mixers in layers 0 and 2, attention in layer 1 (recurrent state rows).
BAMBA = Family("bamba", transformers.BambaConfig, (
    ("num_hidden_layers", 3), ("attn_layer_indices", [1]), ("mamba_n_heads", 4), ("mamba_d_state", 8),
    ("mamba_n_groups", 2), ("mamba_d_conv", 4), ("mamba_expand", 2), ("mamba_chunk_size", 8),
    ("tie_word_embeddings", False),
))
# One B/C group (as most Mamba2 hybrids): under tensor parallelism B and C stay whole on every rank.
BAMBA_ONE_GROUP = Family("bamba-one-group", transformers.BambaConfig, (
    ("num_hidden_layers", 3), ("attn_layer_indices", [1]), ("mamba_n_heads", 4), ("mamba_d_state", 8),
    ("mamba_n_groups", 1), ("mamba_d_conv", 4), ("mamba_expand", 2), ("mamba_chunk_size", 8),
    ("tie_word_embeddings", False),
))
# Granite 4.0 hybrids (tests/ignition/test_granitemoehybrid_recipe.py): Mamba2 mixers in layers 0 and 2, attention in
# layer 1, Granite's multipliers away from 1. Experts (4, top-2) with the shared MLP, rotary attention with q/k/v/o
# biases, two B/C groups, untied; and a dense shared MLP, attention without positions, one group, in/out projection
# biases, no convolution bias, tied.
_GRANITE_HYBRID_SHAPE = (("num_hidden_layers", 3), ("layer_types", ["mamba", "attention", "mamba"]),
                         ("mamba_n_heads", 4), ("mamba_d_state", 8), ("mamba_d_conv", 4), ("mamba_expand", 2),
                         ("mamba_chunk_size", 8), *_GRANITE_MULTIPLIERS)
GRANITE_HYBRID = Family("granite_hybrid", transformers.GraniteMoeHybridConfig, (
    *_GRANITE_HYBRID_SHAPE, ("mamba_n_groups", 2), ("num_local_experts", 4), ("num_experts_per_tok", 2),
    ("intermediate_size", 32), ("shared_intermediate_size", 48), ("position_embedding_type", "rope"),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), ("attention_bias", True),
    ("tie_word_embeddings", False),
))
GRANITE_HYBRID_DENSE = Family("granite_hybrid_dense", transformers.GraniteMoeHybridConfig, (
    *_GRANITE_HYBRID_SHAPE, ("mamba_n_groups", 1), ("num_local_experts", 0), ("shared_intermediate_size", 96),
    ("position_embedding_type", None), ("mamba_proj_bias", True), ("mamba_conv_bias", False),
    ("tie_word_embeddings", True),
))
GRANITE_HYBRID_FAMILIES = (GRANITE_HYBRID, GRANITE_HYBRID_DENSE)
# Nemotron-H (tests/ignition/test_nemotron_h_recipe.py): blocks Mamba2, MLP, attention, Mamba2, Mamba2, MLP - Helios
# layers 0 (mixer + MLP), 1 (attention alone), 2 (mixer alone), 3 (mixer + MLP); Mamba2 heads of 24 (their width
# is not a multiple of hidden_size), two B/C groups, in/out projection and MLP biases, untied.
NEMOTRON_H = Family("nemotron_h", transformers.NemotronHConfig, (
    ("layers_block_type", ["linear_attention", "mlp", "full_attention", "linear_attention", "linear_attention", "mlp"]),
    ("head_dim", 16), ("mamba_num_heads", 4), ("mamba_head_dim", 24), ("ssm_state_size", 8), ("n_groups", 2),
    ("conv_kernel", 4), ("chunk_size", 8), ("use_bias", True), ("mlp_bias", True), ("tie_word_embeddings", False),
))
# Nemotron-H with experts (Nemotron 3 Nano's blocks): Mamba2 + MoE, attention + MLP, Mamba2 + MoE; 8 non-gated relu^2
# experts in 2 groups (1 kept), top-2 of the sigmoid scores plus a random choice bias, renormalised and scaled by
# 2.5, a relu^2 shared expert; no biases, untied.
# Falcon-H1 (tests/ignition/test_falcon_h1_recipe.py): attention and a Mamba2 mixer side by side in each of 2 layers,
# every muP multiplier away from 1; the mixer 96 wide (mamba_d_ssm: not mamba_expand x hidden), two B/C groups,
# gated but not normed; rotary attention with q/k/v/o biases, in_proj / out_proj biases, untied.
_FALCON_H1_MULTIPLIERS = (
    ("embedding_multiplier", 2.0), ("lm_head_multiplier", 0.5), ("key_multiplier", 0.7),
    ("attention_in_multiplier", 1.3), ("attention_out_multiplier", 0.8), ("ssm_in_multiplier", 1.2),
    ("ssm_out_multiplier", 0.9), ("mlp_multipliers", [1.1, 0.6]), ("ssm_multipliers", [0.5, 1.5, 0.8, 1.2, 0.7]))
FALCON_H1 = Family("falcon_h1", transformers.FalconH1Config, (
    ("mamba_d_ssm", 96), ("mamba_n_heads", 4), ("mamba_d_state", 8), ("mamba_n_groups", 2), ("mamba_d_conv", 4),
    ("mamba_chunk_size", 8), ("mamba_proj_bias", True), ("projectors_bias", True), ("attention_bias", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), ("tie_word_embeddings", False),
    *_FALCON_H1_MULTIPLIERS,
))
# The gated norm variant (mamba_rms_norm, the norm after the gate), one group, tied.
FALCON_H1_NORMED = Family("falcon_h1_normed", transformers.FalconH1Config, (
    ("mamba_d_ssm", 96), ("mamba_n_heads", 4), ("mamba_d_state", 8), ("mamba_n_groups", 1), ("mamba_d_conv", 4),
    ("mamba_chunk_size", 8), ("mamba_rms_norm", True), ("mamba_norm_before_gate", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), ("tie_word_embeddings", True),
    *_FALCON_H1_MULTIPLIERS,
))
FALCON_H1_FAMILIES = (FALCON_H1, FALCON_H1_NORMED)
# LFM2 (tests/ignition/test_lfm2_recipe.py): gated short convolutions (3 taps, biases) in layers 0 and 2, attention
# with per-head q/k norms in layer 1; the MLP width auto-adjusted (2/3 of 96, times 1.5, a multiple of 16: 96); untied.
LFM2 = Family("lfm2", transformers.Lfm2Config, (
    ("num_hidden_layers", 3), ("layer_types", ["conv", "full_attention", "conv"]), ("conv_bias", True),
    ("conv_L_cache", 3), ("block_auto_adjust_ff_dim", True), ("block_ffn_dim_multiplier", 1.5),
    ("block_multiple_of", 16), ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
    ("tie_word_embeddings", False),
))
# OLMo Hybrid (tests/ignition/test_olmo_hybrid_recipe.py): Gated DeltaNet layers 0 and 2 (2 key heads of 8, 4 value
# heads of 12, beta doubled), an OLMo 2 attention layer 1 (whole-projection q/k norms, output norms, q/k/v/o biases);
# untied. OLMO_HYBRID_NOPE: its attention unrotated (rope_theta null), beta not doubled, rms_norm_eps 0.1 (not the
# output norm's 1e-5), tied.
_OLMO_HYBRID_SHAPE = (
    ("num_hidden_layers", 3), ("layer_types", ["linear_attention", "full_attention", "linear_attention"]),
    ("linear_num_key_heads", 2), ("linear_num_value_heads", 4), ("linear_key_head_dim", 8),
    ("linear_value_head_dim", 12), ("linear_conv_kernel_dim", 4), *PHI3_IDS,
)
OLMO_HYBRID = Family("olmo_hybrid", transformers.OlmoHybridConfig, (
    *_OLMO_HYBRID_SHAPE, ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}),
))
OLMO_HYBRID_NOPE = Family("olmo_hybrid_nope", transformers.OlmoHybridConfig, (
    *_OLMO_HYBRID_SHAPE, ("linear_allow_neg_eigval", False), ("rms_norm_eps", 0.1), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": None}),
))
# Kimi Linear (tests/ignition/test_kimi_linear_recipe.py): Kimi Delta Attention layers 0 and 2 (3 heads of 8, a decay
# per key channel), a latent attention layer 1 without positions (queries projected directly); layer 0 dense, layers
# 1 and 2 sparse: 8 experts in 2 groups (1 kept), top-3 of the sigmoid scores plus a correction bias, renormalised and
# scaled by 2, a shared expert; untied.
KIMI_LINEAR = Family("kimi_linear", transformers.KimiLinearConfig, (
    ("num_hidden_layers", 3), ("num_key_value_heads", 4),
    ("layer_types", ["linear_attention", "full_attention", "linear_attention"]),
    ("mlp_layer_types", ["dense", "sparse", "sparse"]), ("num_experts", 8), ("num_experts_per_token", 3),
    ("n_group", 2), ("topk_group", 1), ("moe_intermediate_size", 32), ("n_shared_experts", 1),
    ("routed_scaling_factor", 2.0), ("kv_lora_rank", 32), ("q_lora_rank", None), ("qk_rope_head_dim", 16),
    ("qk_nope_head_dim", 16), ("v_head_dim", 24),
    ("linear_attn_config", {"head_dim": 8, "num_heads": 3, "short_conv_kernel_size": 4}),
    ("tie_word_embeddings", False), *PHI3_IDS,
))
# Bailing hybrid (tests/ignition/test_bailing_hybrid_recipe.py): Kimi Linear's shapes with full-rank gates, the safe
# gate (lower bound -5), 4 linear-attention heads of 16 (transformers
# reloads them at head_dim, which it saves as qk_rope_head_dim: the two kept equal), latent attention rotating its interleaved rotary part with
# each head gated; 8 experts in 2 groups (1 kept), top-3, a shared expert; untied.
BAILING_HYBRID = Family("bailing_hybrid", transformers.BailingHybridConfig, (
    ("num_hidden_layers", 3), ("num_key_value_heads", 4),
    ("layer_types", ["linear_attention", "full_attention", "linear_attention"]),
    ("mlp_layer_types", ["dense", "sparse", "sparse"]), ("num_local_experts", 8), ("num_experts_per_tok", 3),
    ("n_group", 2), ("topk_group", 1), ("moe_intermediate_size", 32), ("n_shared_experts", 1),
    ("routed_scaling_factor", 2.0), ("kv_lora_rank", 32), ("q_lora_rank", None), ("qk_rope_head_dim", 16),
    ("qk_nope_head_dim", 16), ("v_head_dim", 24), ("head_dim", 16),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), ("tie_word_embeddings", False), *PHI3_IDS,
))
# LFM2-MoE (tests/ignition/test_lfm2_recipe.py): LFM2's layers without biases, layer 0's MLP dense, layers 1 and 2 a
# mixture of 8 experts: top-3 of the sigmoid scores plus a random choice bias, renormalised and scaled by 1.5; tied.
LFM2_MOE = Family("lfm2_moe", transformers.Lfm2MoeConfig, (
    ("num_hidden_layers", 3), ("layer_types", ["conv", "full_attention", "conv"]), ("num_dense_layers", 1),
    ("num_experts", 8), ("num_experts_per_tok", 3), ("moe_intermediate_size", 32), ("routed_scaling_factor", 1.5),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), ("tie_word_embeddings", True),
))
NEMOTRON_H_MOE = Family("nemotron_h_moe", transformers.NemotronHConfig, (
    ("layers_block_type", ["linear_attention", "moe", "full_attention", "mlp", "linear_attention", "moe"]),
    ("head_dim", 16), ("mamba_num_heads", 4), ("mamba_head_dim", 32), ("ssm_state_size", 8), ("n_groups", 1),
    ("conv_kernel", 4), ("chunk_size", 8), ("n_routed_experts", 8), ("num_experts_per_tok", 2),
    ("moe_intermediate_size", 32), ("moe_shared_expert_intermediate_size", 48), ("n_group", 2), ("topk_group", 1),
    ("routed_scaling_factor", 2.5), ("norm_topk_prob", True), ("tie_word_embeddings", False),
))
# Qwen3-Next: Gated DeltaNet layers 0 and 2 (2 key heads of 8, 4 value heads of 12: two value heads per
# key head), a gated attention layer 1 (q/k norms, rotary on half of each 16-wide head); experts (4,
# top-2, a gated shared expert) in layers 0 and 2, layer 1 dense (mlp_only_layers).
QWEN3_NEXT = Family("qwen3_next", transformers.Qwen3NextConfig, (
    ("num_hidden_layers", 3), ("layer_types", ["linear_attention", "full_attention", "linear_attention"]),
    ("head_dim", 16), ("linear_num_key_heads", 2), ("linear_num_value_heads", 4), ("linear_key_head_dim", 8),
    ("linear_value_head_dim", 12), ("linear_conv_kernel_dim", 4), ("num_experts", 4), ("num_experts_per_tok", 2),
    ("moe_intermediate_size", 32), ("shared_expert_intermediate_size", 48), ("mlp_only_layers", [1]),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5}),
    ("tie_word_embeddings", False),
))
# Qwen3.5 text decoders: the same dataflow with whole in_proj_qkv / z / b / a projections; dense MLPs in
# every layer (Qwen3_5ForCausalLM) or experts in every layer (Qwen3_5MoeForCausalLM); the released
# configs' interleaved multimodal rope settings (text positions: the ordinary rope); tied embeddings.
_QWEN3_5_SHAPE = (
    ("num_hidden_layers", 3), ("layer_types", ["linear_attention", "full_attention", "linear_attention"]),
    ("head_dim", 16), ("linear_num_key_heads", 2), ("linear_num_value_heads", 4), ("linear_key_head_dim", 8),
    ("linear_value_head_dim", 12), ("linear_conv_kernel_dim", 4),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.25,
                         "mrope_interleaved": True, "mrope_section": [1, 1, 0]}),
)
QWEN3_5 = Family("qwen3_5", transformers.Qwen3_5TextConfig, (*_QWEN3_5_SHAPE, ("tie_word_embeddings", True)))
QWEN3_5_MOE = Family("qwen3_5_moe", transformers.Qwen3_5MoeTextConfig, (
    *_QWEN3_5_SHAPE, ("num_experts", 4), ("num_experts_per_tok", 2), ("moe_intermediate_size", 32),
    ("shared_expert_intermediate_size", 48), ("tie_word_embeddings", False),
))

# EXAONE 4 (tests/ignition/test_exaone4_recipe.py): norms only after attention and MLP, per-head q/k norms; sliding,
# sliding, global layers over a window of 5 (the global layer rotates nothing), llama3-scaled rope, untied.
EXAONE4 = Family("exaone4", transformers.Exaone4Config, (
    ("num_hidden_layers", 3), ("sliding_window", 5), ("sliding_window_pattern", 3), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), *PHI3_IDS,
))
# Apertus (tests/ignition/test_apertus_recipe.py): per-head q/k norms, the non-gated xIELU MLP (its learned scalars
# drawn per layer), q/k/v/o biases, a llama3-scaled rope, untied.
APERTUS = Family("apertus", transformers.ApertusConfig, (
    ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), *PHI3_IDS,
))
# Arcee (tests/ignition/test_arcee_recipe.py): the non-gated relu^2 MLP with biases, q/k/v/o biases, a YaRN rope
# (theta 10000 over an original context of 64), tied.
ARCEE = Family("arcee", transformers.ArceeConfig, (
    ("attention_bias", True), ("mlp_bias", True), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64}), *PHI3_IDS,
))
# Llama 4 (tests/ignition/test_llama4_recipe.py): RoPE layers (chunked attention over chunks of 8 positions, L2 q/k
# norms after the interleaved-pair rotation) alternating with NoPE layers (full attention, queries scaled by the
# temperature tuning, floor_scale 4); dense and sparse MLPs interleaved (4 experts, top-2 sigmoid weights on the
# experts' inputs, a shared expert); untied.
LLAMA4 = Family("llama4", transformers.Llama4TextConfig, (
    ("num_hidden_layers", 4), ("head_dim", 16), ("intermediate_size", 32), ("intermediate_size_mlp", 96),
    ("num_local_experts", 4), ("num_experts_per_tok", 2), ("interleave_moe_layer_step", 2),
    ("no_rope_layer_interval", 2), ("attention_chunk_size", 8), ("floor_scale", 4), ("attn_scale", 0.5),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), ("tie_word_embeddings", False), *PHI3_IDS,
))
# MiniMax-M2 (tests/ignition/test_minimax_m2_recipe.py): q/k norms over whole projections before a partial rotation
# (rotary_dim 8 of 16), 6 experts in every layer, top-2 of the sigmoid scores plus a correction bias, renormalised.
MINIMAX_M2 = Family("minimax_m2", transformers.MiniMaxM2Config, (
    ("head_dim", 16), ("intermediate_size", 32), ("num_local_experts", 6), ("num_experts_per_tok", 2),
    ("rotary_dim", 8), ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}),
    ("tie_word_embeddings", False), *PHI3_IDS,
))
# DBRX (tests/ignition/test_dbrx_recipe.py): LayerNorms without biases, the fused q/k/v projection clamped to
# [-0.1, 0.1] (its norms draw small weights: most outputs reach past it), 4 experts in every layer (top-2 of the
# softmax renormalised), untied.
DBRX = Family("dbrx", transformers.DbrxConfig, (
    ("attn_config", {"kv_n_heads": 2, "clip_qkv": 0.1, "rope_theta": 100.0}),
    ("d_model", 64), ("ffn_config", {"ffn_hidden_size": 32, "moe_num_experts": 4, "moe_top_k": 2}),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), ("tie_word_embeddings", False), *PHI3_IDS,
))
# PhiMoE (tests/ignition/test_phimoe_recipe.py): LayerNorms with biases, q/k/v/o and lm_head biases, SparseMixer top-2
# routing of 4 experts (jitter threshold 0.3, so the masks bind), Phi-3.5-MoE's longrope (short factors, equal
# mscales), untied.
PHIMOE = Family("phimoe", transformers.PhimoeConfig, (
    ("intermediate_size", 32), ("num_local_experts", 4), ("router_jitter_noise", 0.3), ("attention_bias", True),
    ("lm_head_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "longrope", "rope_theta": 100.0,
                         "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 4.0], "long_factor": [2.0] * 8,
                         "short_mscale": 1.2, "long_mscale": 1.2, "original_max_position_embeddings": 64}), *PHI3_IDS,
))
# Nemotron (tests/ignition/test_nemotron_recipe.py): LayerNorm1P norms (weight + 1, biases), the non-gated relu^2 MLP
# with biases, q/k/v/o biases, partial rotary (8 of each head's 16 dims, theta 100), untied.
NEMOTRON = Family("nemotron", transformers.NemotronConfig, (
    ("attention_bias", True), ("mlp_bias", True), ("norm_eps", 1e-4), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# StableLM (tests/ignition/test_stablelm_recipe.py): LayerNorms with biases, the parallel residual, per-head q/k
# LayerNorms, q/k/v biases, partial rotary (8 of each head's 16 dims, theta 100), untied.
STABLELM = Family("stablelm", transformers.StableLmConfig, (
    ("use_parallel_residual", True), ("qk_layernorm", True), ("use_qkv_bias", True), ("layer_norm_eps", 1e-4),
    ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# GPT-NeoX (tests/ignition/test_gpt_neox_recipe.py): multi-head attention through the per-head fused q/k/v, biased
# LayerNorms, the parallel residual with the MLP's own norm, the non-gated exact-GELU MLP, partial rotary (8 of each
# head's 16 dims, theta 100), untied.
GPT_NEOX = Family("gpt_neox", transformers.GPTNeoXConfig, (
    ("layer_norm_eps", 1e-4), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# GLM v1 (tests/ignition/test_glm_recipe.py): GLM-4 dense without the sandwich norms: fused gate_up_proj, q/k/v biases,
# interleaved partial rotary (8 of each head's 16 dims, theta 100), untied.
GLM = Family("glm", transformers.GlmConfig, (
    ("head_dim", 16), ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}), *PHI3_IDS,
))
# Helium (tests/ignition/test_helium_recipe.py): interleaved rotary over whole heads (theta 100), q/k/v and MLP biases,
# untied.
HELIUM = Family("helium", transformers.HeliumConfig, (
    ("head_dim", 16), ("attention_bias", True), ("mlp_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 100.0}), *PHI3_IDS,
))
# Ministral (tests/ignition/test_ministral_recipe.py): sliding, full, sliding layers over a window of 5, untied.
MINISTRAL = Family("ministral", transformers.MinistralConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("sliding_window", 5), ("tie_word_embeddings", False),
    ("layer_types", ["sliding_attention", "full_attention", "sliding_attention"]),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
# VaultGemma (tests/ignition/test_vaultgemma_recipe.py): Gemma 2 without sandwich norms: sliding, full, sliding layers
# over a window of 5, query_pre_attn_scalar 8, both soft caps, tied.
VAULTGEMMA = Family("vaultgemma", transformers.VaultGemmaConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("sliding_window", 5), ("query_pre_attn_scalar", 8),
    ("attn_logit_softcapping", 5.0), ("final_logit_softcapping", 3.0), ("tie_word_embeddings", True),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
# OLMo v1 (tests/ignition/test_olmo1_recipe.py): LayerNorms without parameters, q/k/v clamped to +-0.8, q/k/v/o
# biases, untied.
OLMO1 = Family("olmo1", transformers.OlmoConfig, (
    ("clip_qkv", 0.8), ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
# Ministral 3 (tests/ignition/test_ministral3_recipe.py): queries scaled by 1 + 0.5 log(1 + floor(p / 16)) after a YaRN
# rope over an original context of 16 (the prompts and their continuations pass it, batched ones twice), untied.
MINISTRAL3 = Family("ministral3", transformers.Ministral3Config, (
    ("head_dim", 16), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 32.0, "original_max_position_embeddings": 16,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "llama_4_scaling_beta": 0.5}), *PHI3_IDS,
))
# K-EXAONE (tests/ignition/test_exaone_moe_recipe.py): per-head q/k norms, sliding, sliding, global layers over a window
# of 5 (the global layer rotates nothing); a dense then two sparse layers: 8 experts routed as DeepSeek-V3 routes
# (sigmoid with the correction bias, 2 groups of which 1 is kept, top-3 renormalised and scaled by 2) beside a shared
# expert; untied.
EXAONE_MOE = Family("exaone_moe", transformers.ExaoneMoeConfig, (
    ("num_hidden_layers", 3), ("sliding_window", 5), ("sliding_window_pattern", 3), ("first_k_dense_replace", 1),
    ("num_experts", 8), ("num_experts_per_tok", 3), ("n_group", 2), ("topk_group", 1), ("moe_intermediate_size", 32),
    ("num_shared_experts", 1), ("routed_scaling_factor", 2.0), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# Solar Open (tests/ignition/test_solar_open_recipe.py): q/k/v biases, 8 experts in every layer routed as DeepSeek-V3
# routes (sigmoid with the correction bias, 2 groups of which 1 is kept, top-3 renormalised and scaled by 1.5) beside
# two shared experts' width; untied.
SOLAR_OPEN = Family("solar_open", transformers.SolarOpenConfig, (
    ("head_dim", 16), ("attention_bias", True), ("n_routed_experts", 8), ("num_experts_per_tok", 3), ("n_group", 2),
    ("topk_group", 1), ("moe_intermediate_size", 32), ("n_shared_experts", 2), ("routed_scaling_factor", 1.5),
    ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# AFMoE (tests/ignition/test_afmoe_recipe.py): per-head q/k norms, sliding, sliding, full layers over a window of 5 (the
# full layer rotates nothing), the attention output gated by sigmoid(gate_proj x), q/k/v/o biases, four norms a layer,
# embeddings scaled by sqrt(64) (mup_enabled); a dense then two sparse layers: 8 experts, top-3 of the sigmoid scores
# plus a correction bias, renormalised and scaled by 1.5, beside a shared expert; untied.
AFMOE = Family("afmoe", transformers.AfmoeConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("global_attn_every_n_layers", 3), ("sliding_window", 5),
    ("num_dense_layers", 1), ("num_experts", 8), ("num_experts_per_tok", 3), ("moe_intermediate_size", 32),
    ("num_shared_experts", 1), ("route_scale", 1.5), ("mup_enabled", True), ("attention_bias", True),
    ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# FlexOlmo (tests/ignition/test_flex_olmo_recipe.py): OLMo 2's block (norms only after the attention and the MLP, q/k
# norms over whole projections) with q/k/v/o biases, 6 experts in every layer (top-2 of the softmax, renormalised), untied.
FLEX_OLMO = Family("flex_olmo", transformers.FlexOlmoConfig, (
    ("intermediate_size", 32), ("num_experts", 6), ("num_experts_per_tok", 2), ("norm_topk_prob", True),
    ("attention_bias", True), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# Granite SWA (tests/ignition/test_granite_swa_recipe.py): Granite's multipliers, a learned sink per head, a full
# layer without positions (rope base 0) and two sliding layers over a window of 5 rotating with bases 1000 and 500
# (two rotary tables), untied.
GRANITE_SWA = Family("granite_swa", transformers.GraniteSWAConfig, (
    ("num_hidden_layers", 3), ("sliding_window", 5), ("layer_rope_theta", [0, 1000.0, 500.0]),
    *_GRANITE_MULTIPLIERS, ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))
# Granite MoE SWA: Granite MoE Shared's experts (4, top-2 softmax) and shared expert beside the sinks, sliding, full
# layers over a window of 5 and one rope base, Granite's multipliers, untied.
GRANITE_MOE_SWA = Family("granitemoe_swa", transformers.GraniteMoeSWAConfig, (
    ("layer_types", ["sliding_attention", "full_attention"]), ("sliding_window", 5), ("intermediate_size", 32),
    ("num_local_experts", 4), ("num_experts_per_tok", 2), ("shared_intermediate_size", 48), *_GRANITE_MULTIPLIERS,
    ("tie_word_embeddings", False), ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# CWM (tests/ignition/test_cwm_recipe.py): Llama with full, sliding, sliding layers over a window of 5 and a
# llama3-scaled rope, untied.
CWM = Family("cwm", transformers.CwmConfig, (
    ("num_hidden_layers", 3), ("head_dim", 16), ("sliding_window", 5), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "llama3", "rope_theta": 1000.0, "factor": 4.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    ("pad_token_id", None), ("bos_token_id", 1), ("eos_token_id", None),
))
# Jais 2 (tests/ignition/test_jais2_recipe.py): LayerNorms with biases, q/k/v/o biases, the non-gated relu^2 MLP with
# biases, untied.
JAIS2 = Family("jais2", transformers.Jais2Config, (
    ("head_dim", 16), ("layer_norm_eps", 1e-4), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# nanochat (tests/ignition/test_nanochat_recipe.py): parameter-free RMS norms (the embeddings' too), the reversed
# rotation, per-head q/k norms after it, the non-gated relu^2 MLP, final logits capped at 3, untied.
NANOCHAT = Family("nanochat", transformers.NanoChatConfig, (
    ("final_logit_softcapping", 3.0), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

# JetMoE (tests/ignition/test_jetmoe_recipe.py): a mixture of attention heads (4 experts of 2 query heads of 16 over
# 2 key/value heads, top-2 softmax, an output bias) and of gated experts (4, top-2, an output bias), untied.
JETMOE = Family("jetmoe", transformers.JetMoeConfig, (
    ("num_local_experts", 4), ("num_experts_per_tok", 2), ("kv_channels", 16), ("intermediate_size", 32),
    ("rms_norm_eps", 1e-6), ("tie_word_embeddings", False),
    ("rope_parameters", {"rope_type": "default", "rope_theta": 1000.0}), *PHI3_IDS,
))

def random_model(family: Family, seed: int = 0) -> torch.nn.Module:
    """The float32 reference model of `family` with every parameter re-drawn from `seed`."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(family.config()).float().eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(_draw(name, parameter, generator))
        for name, buffer in model.named_buffers():
            if name.endswith(("e_score_correction_bias", "feed_forward.expert_bias")):  # sigmoid routing's choice bias
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator))
    return model


def write_checkpoint(model: torch.nn.Module, directory: Path) -> Path:
    """Save `model` as a Hugging Face checkpoint directory (safetensors weights) and return it."""
    model.save_pretrained(directory)
    return directory


def rewritten_checkpoint(directory: Path, tmp_path: Path, edit) -> Path:
    """A copy of checkpoint `directory` under `tmp_path` whose config.json dict `edit` changed in place."""
    copy = Path(shutil.copytree(directory, tmp_path / "checkpoint"))
    path = copy / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))
    return copy


def assert_refused(directory: Path, tmp_path: Path, edit, setting: str, error: type = UnsupportedCheckpoint) -> None:
    """Preparing a copy of checkpoint `directory` whose config.json `edit` changed raises `error` naming `setting`."""
    with pytest.raises(error, match=setting):
        load_checkpoint(rewritten_checkpoint(directory, tmp_path, edit))


def _draw(name: str, parameter: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(parameter.shape, generator=generator)
    if name.endswith("norm.weight"):
        return 1.0 + 0.1 * noise
    if name.endswith("bias"):
        return 0.1 * noise
    if name.endswith("sinks"):
        return noise
    if "embed_tokens" in name:
        return noise
    if name.startswith("lm_head"):
        return 0.3 * noise
    if ".mamba." in name and parameter.dim() == 1:  # per-head mixer parameters (A_log, D)
        return 0.5 * noise
    return noise / parameter.shape[-1] ** 0.5
