"""The reference's values for the settings a config.json leaves out.

transformers fills a key missing from config.json with its config class's default, and for several
families that default is not the generic fallback a recipe reads (Mixtral's ``rope_theta`` 1e6 and
``rms_norm_eps`` 1e-5, Mistral's ``sliding_window`` 4096, GLM-4.5's ``partial_rotary_factor`` 0.5,
DeepSeek-V3's routing groups, ...). `with_reference_defaults` fills them in before a recipe reads
the configuration, so a terse config.json prepares the model the reference loads, not another one.
Only missing keys are filled: an explicit null keeps its meaning (``"sliding_window": null`` is full
attention). Values are transformers 5's class defaults.
"""

from __future__ import annotations

from typing import Any, Mapping

_GROUPED_QWEN = {"max_window_layers": 28, "num_key_value_heads": 32, "sliding_window": 4096}
REFERENCE_DEFAULTS: dict[str, dict[str, Any]] = {
    "MistralForCausalLM": {"sliding_window": 4096, "num_key_value_heads": 8},
    "Qwen2ForCausalLM": _GROUPED_QWEN,
    "Qwen3ForCausalLM": {**_GROUPED_QWEN, "head_dim": 128},
    "Qwen3MoeForCausalLM": {"num_key_value_heads": 4, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                            "sliding_window": 4096},
    "Qwen2MoeForCausalLM": {"num_key_value_heads": 16, "sliding_window": 4096, "max_window_layers": 28,
                            "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                            "shared_expert_intermediate_size": 5632, "qkv_bias": True,
                            "max_position_embeddings": 32768},
    "OlmoeForCausalLM": {"rms_norm_eps": 1e-5, "num_experts": 64, "num_experts_per_tok": 8, "intermediate_size": 2048,
                         "max_position_embeddings": 4096},
    "MixtralForCausalLM": {"rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "num_key_value_heads": 8,
                           "num_local_experts": 8, "num_experts_per_tok": 2},
    "Glm4MoeForCausalLM": {"rms_norm_eps": 1e-5, "partial_rotary_factor": 0.5, "num_key_value_heads": 8,
                           "n_routed_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 1408,
                           "n_shared_experts": 1, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1},
    "DeepseekV3ForCausalLM": {"n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
                              "n_group": 8, "topk_group": 4, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                              "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
                              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                              "num_nextn_predict_layers": 1},
    "DeepseekV2ForCausalLM": {"n_routed_experts": 64, "moe_intermediate_size": 1407, "n_shared_experts": 2,
                              "routed_scaling_factor": 1.0, "first_k_dense_replace": 0, "topk_method": "greedy",
                              "norm_topk_prob": False, "q_lora_rank": 1536, "kv_lora_rank": 512,
                              "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                              "max_position_embeddings": 2048},
    "Glm4MoeLiteForCausalLM": {"n_routed_experts": 64, "num_experts_per_tok": 4, "moe_intermediate_size": 1536,
                               "n_group": 1, "topk_group": 1, "n_shared_experts": 1, "routed_scaling_factor": 1.8,
                               "norm_topk_prob": True, "q_lora_rank": 768, "kv_lora_rank": 512,
                               "qk_rope_head_dim": 64, "qk_nope_head_dim": 192, "v_head_dim": 256,
                               "rms_norm_eps": 1e-5, "max_position_embeddings": 202_752, "rope_interleave": True},
    "Dots1ForCausalLM": {"num_key_value_heads": 32, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0,
                         "norm_topk_prob": False, "routed_scaling_factor": 1.0, "sliding_window": 4096,
                         "max_window_layers": 62, "max_position_embeddings": 2048},
    "GptOssForCausalLM": {"sliding_window": 128, "num_key_value_heads": 8, "head_dim": 64,
                          "num_local_experts": 128, "num_experts_per_tok": 4},
    "BambaForCausalLM": {"num_key_value_heads": 8, "mamba_d_head": 64, "partial_rotary_factor": 0.5},
    "Qwen3NextForCausalLM": {"vocab_size": 151_936, "hidden_size": 2048, "intermediate_size": 5632,
                             "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2,
                             "head_dim": 256, "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25,
                             "max_position_embeddings": 32768, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
                             "linear_value_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
                             "decoder_sparse_step": 1, "moe_intermediate_size": 512,
                             "shared_expert_intermediate_size": 512, "num_experts_per_tok": 10, "num_experts": 512,
                             "norm_topk_prob": True},
    "Qwen3_5ForCausalLM": {"vocab_size": 248_320, "hidden_size": 4096, "intermediate_size": 12_288,
                           "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
                           "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25, "max_position_embeddings": 32768,
                           "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                           "linear_num_key_heads": 16, "linear_num_value_heads": 32},
    "Qwen3_5MoeForCausalLM": {"vocab_size": 248_320, "hidden_size": 2048, "num_hidden_layers": 40,
                              "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "rms_norm_eps": 1e-6,
                              "partial_rotary_factor": 0.25, "max_position_embeddings": 32768,
                              "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                              "linear_num_key_heads": 16, "linear_num_value_heads": 32, "moe_intermediate_size": 512,
                              "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256},
    "SmolLM3ForCausalLM": {"rope_theta": 2000000.0, "num_key_value_heads": 4, "tie_word_embeddings": True,
                           "no_rope_layer_interval": 4, "max_position_embeddings": 32768},
    "SeedOssForCausalLM": {"num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 524288},
    "Ernie4_5ForCausalLM": {"rope_theta": 500000.0, "num_key_value_heads": 2, "head_dim": 128, "rms_norm_eps": 1e-5,
                            "tie_word_embeddings": True, "max_position_embeddings": 131072},
    "GraniteForCausalLM": {"max_position_embeddings": 2048},
    "HunYuanDenseV1ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
    "Glm4ForCausalLM": {"vocab_size": 151_552, "hidden_size": 4096, "intermediate_size": 13_696,
                        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
                        "hidden_act": "silu", "rms_norm_eps": 1.5625e-7, "tie_word_embeddings": False,
                        "partial_rotary_factor": 0.5, "max_position_embeddings": 131_072},
    "Gemma3ForCausalLM": {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216,
                          "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                          "query_pre_attn_scalar": 256, "sliding_window": 4096, "sliding_window_pattern": 6,
                          "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0},
    "CohereForCausalLM": {"rope_theta": 500_000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
                          "tie_word_embeddings": True, "max_position_embeddings": 8192},
    "GemmaForCausalLM": {"vocab_size": 256_000, "hidden_size": 3072, "intermediate_size": 24_576,
                         "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256,
                         "hidden_act": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                         "rope_theta": 10_000.0, "max_position_embeddings": 8192},
    "Gemma2ForCausalLM": {"vocab_size": 256_000, "hidden_size": 2304, "intermediate_size": 9216,
                          "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
                          "query_pre_attn_scalar": 256, "sliding_window": 4096, "final_logit_softcapping": 30.0,
                          "attn_logit_softcapping": 50.0, "rope_theta": 10_000.0, "max_position_embeddings": 8192},
    "Cohere2ForCausalLM": {"rope_theta": 10_000.0, "layer_norm_eps": 1e-5, "logit_scale": 0.0625,
                           "tie_word_embeddings": True, "max_position_embeddings": 8192, "sliding_window": 4096},
    "Starcoder2ForCausalLM": {"norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh", "tie_word_embeddings": True,
                              "rope_theta": 10_000.0, "max_position_embeddings": 4096},
    "Phi3ForCausalLM": {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096},
}


def with_reference_defaults(source: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with the `source` family's reference defaults for the keys it does not hold."""
    return {**REFERENCE_DEFAULTS.get(source, {}), **config}
