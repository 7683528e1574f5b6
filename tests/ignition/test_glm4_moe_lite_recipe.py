"""GLM-4.7-Flash (Glm4MoeLiteForCausalLM) against transformers on a tiny random float32 checkpoint.

Its dataflow is DeepSeek-V3's (the deepseek recipe): latent attention with the low-rank query pair,
YaRN with DeepSeek's mscale, interleaved rotary rows, sigmoid routing with the correction bias in
groups; its sparse layers come from ``mlp_layer_types`` (here sparse, dense, sparse). Prefill logits,
scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); a terse config.json takes
Glm4MoeLiteConfig's layer kinds; unknown layer kinds are refused by name.
"""

from __future__ import annotations

import pytest

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, deepseek, load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import GLM4_MOE_LITE, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GLM4_MOE_LITE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


@pytest.fixture(scope="module")
def checkpoint(prepared, tmp_path_factory):
    return write_checkpoint(prepared.reference, tmp_path_factory.mktemp("glm4_moe_lite"))


def test_the_layer_kinds_and_routing_come_from_the_config(prepared):
    arch = prepared.recipe.architecture
    assert [arch.is_sparse(layer) for layer in range(3)] == [True, False, True]
    assert (arch.moe.scoring, arch.moe.correction_bias, arch.moe.num_groups, arch.moe.topk_groups,
            arch.moe.normalize, arch.moe.scale) == ("sigmoid", True, 2, 1, True, 1.8)
    assert arch.latent.q_lora_rank == 24 and arch.latent.rope_attention_factor != 1.0
    assert list(dict(prepared.recipe.weights)) == [slot.name for slot in weight_layout(arch)]
    assert prepared.reference.model.layers[1].mlp.__class__.__name__.endswith("MLP")


def test_without_layer_kinds_the_first_layer_is_dense(prepared):
    """Glm4MoeLiteConfig's default: dense, then sparse (first_k_dense_replace, agreeing or not, is not
    read: test_glm4_moe_lite_layer_kinds)."""
    config = {key: value for key, value in prepared.reference.config.to_dict().items() if key != "mlp_layer_types"}
    assert deepseek.lite_experts("Glm4MoeLiteForCausalLM", config).sparse_layers == (1, 2)
    for first_dense in (1, 0, 3):
        stated = config | {"first_k_dense_replace": first_dense}
        assert deepseek.lite_experts("Glm4MoeLiteForCausalLM", stated).sparse_layers == (1, 2)
    assert deepseek.lite_experts("Glm4MoeLiteForCausalLM", config | {"num_hidden_layers": 1}) is None


@pytest.mark.parametrize("change,message", [
    ({"mlp_layer_types": ["sparse", "dense"]}, "mlp_layer_types"),
    ({"mlp_layer_types": ["sparse", "shared", "sparse"]}, "mlp_layer_types"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"attention_bias": True}, "attention_bias"),
])
def test_unsupported_configs_are_refused_by_name(checkpoint, tmp_path, change, message):
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))
