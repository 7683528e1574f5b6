"""GLM-4.7-Flash's sparse layers are those ``mlp_layer_types`` marks, whatever ``first_k_dense_replace``
says: Glm4MoeLiteForCausalLM never reads it. A config.json whose ``first_k_dense_replace`` disagrees with
the layer kinds (GLM-4.5's spelling left beside them) was refused; it prepares the model transformers
loads, its float32 logits, scored log-probabilities and greedy tokens equal to the reference's
(`test_config_fuzz.check_variant`)."""

from __future__ import annotations

import pytest
import transformers

from .hf_checkpoints import Family
from .test_config_fuzz import Variant, check_variant

_LITE = (("vocab_size", 97), ("hidden_size", 32), ("intermediate_size", 48), ("num_attention_heads", 2),
         ("num_key_value_heads", 2), ("q_lora_rank", 16), ("kv_lora_rank", 16), ("qk_rope_head_dim", 8),
         ("qk_nope_head_dim", 8), ("v_head_dim", 8), ("n_routed_experts", 4), ("num_experts_per_tok", 2),
         ("n_group", 2), ("topk_group", 1), ("moe_intermediate_size", 16), ("n_shared_experts", 1),
         ("routed_scaling_factor", 2.5), ("max_position_embeddings", 512), ("tie_word_embeddings", False))


@pytest.mark.parametrize("kinds, first_dense", [
    (["sparse", "dense", "sparse"], 1),  # read as GLM-4.5's: dense, sparse, sparse
    (["dense", "sparse", "sparse"], 0),  # every layer sparse
    (None, 3),  # Glm4MoeLiteConfig's default (dense, then sparse) against every layer dense
], ids=["sparse-dense-sparse vs 1", "dense-sparse-sparse vs 0", "default vs 3"])
def test_a_disagreeing_first_k_dense_replace_prepares_the_reference_model(tmp_path, kinds, first_dense):
    overrides = (("num_hidden_layers", 3), *_LITE, *((("mlp_layer_types", kinds),) if kinds else ()))
    legacy = (("first_k_dense_replace", first_dense),) + ((("mlp_layer_types", None),) if kinds is None else ())
    variant = Variant(Family("glm4_moe_lite-layer-kinds", transformers.Glm4MoeLiteConfig, overrides), legacy)
    assert check_variant(variant, tmp_path) == "matches"
