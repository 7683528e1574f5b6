"""The DeepSeek-V2 recipe against transformers' DeepseekV2ForCausalLM on tiny random float32 checkpoints.

The shapes (tests/ignition/hf_checkpoints.py): DEEPSEEK_V2 (queries through the low-rank pair, YaRN
with DeepSeek's mscale, one dense then two sparse layers routed "group_limited_greedy": softmax, groups
scored by their best expert, weights scaled and never renormalised, two shared experts) and
DEEPSEEK_V2_LITE (queries projected directly, "greedy" routing, the default rope). Prefill logits,
scored log-probabilities and greedy tokens (single, batched, from cached prefix pages) equal the
reference's (test_equivalence's checks and tolerances); the rope arithmetic is the reference's; the
prepared rotary rows are de-interleaved; the group limit and the de-interleaving each matter;
unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import DEEPSEEK_V2, DEEPSEEK_V2_LITE, random_model, rewritten_checkpoint, write_checkpoint
from .test_deepseek_recipe import eager_prefill_logits


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(DEEPSEEK_V2)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


@pytest.fixture(scope="module")
def lite(tmp_path_factory):
    """(reference, recipe, checkpoint directory) of DeepSeek-V2-Lite's shape."""
    model = random_model(DEEPSEEK_V2_LITE)
    directory = write_checkpoint(model, tmp_path_factory.mktemp("deepseek_v2_lite"))
    return model, load_checkpoint(directory), directory


def _expected(model, prompt) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0, -1]


def test_architecture_fields_come_from_the_config(prepared, lite):
    arch = prepared.recipe.architecture
    latent, experts = arch.latent, arch.moe
    assert (latent.q_lora_rank, latent.kv_lora_rank, latent.qk_nope_head_dim, latent.v_head_dim) == (24, 32, 16, 24)
    assert (experts.sparse_layers, experts.num_experts, experts.experts_per_token) == ((1, 2), 8, 3)
    assert (experts.scoring, experts.num_groups, experts.topk_groups, experts.normalize, experts.scale,
            experts.correction_bias) == ("softmax", 4, 2, False, 2.5, False)
    assert (experts.expert_intermediate_size, experts.shared_intermediate_size) == (32, 64)
    lite_arch = lite[1].architecture
    assert lite_arch.latent.q_lora_rank == 0
    assert (lite_arch.moe.num_groups, lite_arch.moe.experts_per_token, lite_arch.moe.sparse_layers) == (1, 2, (1,))


def test_yarn_frequencies_attention_factor_and_softmax_scale_equal_the_reference(prepared):
    model, recipe = prepared.reference, prepared.recipe
    rotary = model.model.rotary_emb
    assert torch.equal(dict(recipe.weights)["rope.inv_freq"], rotary.inv_freq)
    assert recipe.architecture.latent.rope_attention_factor == pytest.approx(rotary.attention_scaling, rel=1e-12)
    assert recipe.architecture.attention_scale == pytest.approx(model.model.layers[0].self_attn.scaling, rel=1e-12)
    assert recipe.architecture.latent.rope_attention_factor != 1.0  # mscale != mscale_all_dim: it matters here


def test_weights_follow_the_layout_with_rotary_rows_de_interleaved(prepared, lite):
    model, weights = prepared.reference, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(prepared.recipe.architecture)]
    attention = model.model.layers[1].self_attn
    q_b, ours = attention.q_b_proj.weight.view(4, 32, 24), weights["layers.1.q_b.weight"].view(4, 32, 24)
    assert torch.equal(ours[:, :16], q_b[:, :16])  # no-rotary rows untouched
    assert torch.equal(ours[:, 16:24], q_b[:, 16::2]) and torch.equal(ours[:, 24:], q_b[:, 17::2])
    assert torch.equal(weights["layers.1.kv_a.weight"][32:40], attention.kv_a_proj_with_mqa.weight[32::2])
    mlp = model.model.layers[2].mlp
    assert torch.equal(weights["layers.2.router.weight"], mlp.gate.weight)
    assert torch.equal(weights["layers.2.experts.down"][5], mlp.experts.down_proj[5])
    lite_model, lite_weights = lite[0], dict(lite[1].weights)
    q = lite_model.model.layers[0].self_attn.q_proj.weight.view(4, 32, 64)
    assert torch.equal(lite_weights["layers.0.q.weight"].view(4, 32, 64)[:, 16:24], q[:, 16::2])


def test_the_group_limit_and_the_rotary_layout_each_matter(prepared):
    """Routing over every expert (no group limit), or the rotary rows in the checkpoint's order (the
    reference's pairs rotated as halves), moves the logits past ten times the tolerance."""
    arch, recipe, prompt = prepared.recipe.architecture, prepared.recipe, equivalence.random_prompt(13, seed=1)
    expected = _expected(prepared.reference, prompt)
    assert equivalence.relative_error(eager_prefill_logits(recipe, prompt), expected) < 1e-4
    ungrouped = dataclasses.replace(recipe, architecture=dataclasses.replace(
        arch, moe=dataclasses.replace(arch.moe, num_groups=1, topk_groups=1)))
    assert equivalence.relative_error(eager_prefill_logits(ungrouped, prompt), expected) > 10 * equivalence.TOLERANCE
    model = prepared.reference
    checkpoint_order = {"layers.0.q_b.weight": model.model.layers[0].self_attn.q_b_proj.weight.detach(),
                        "layers.0.kv_a.weight": model.model.layers[0].self_attn.kv_a_proj_with_mqa.weight.detach()}
    interleaved = dataclasses.replace(recipe, weights=tuple(
        w._replace(tensor=checkpoint_order.get(w.name, w.tensor)) for w in recipe.weights))
    assert equivalence.relative_error(eager_prefill_logits(interleaved, prompt), expected) > 10 * equivalence.TOLERANCE


def test_the_lite_shape_matches_the_reference(lite):
    model, recipe, _ = lite
    prompt = equivalence.random_prompt(13, seed=2)
    assert equivalence.relative_error(eager_prefill_logits(recipe, prompt), _expected(model, prompt)) < 1e-4


def test_a_terse_config_takes_the_config_class_defaults(lite, tmp_path):
    """Without q_lora_rank DeepseekV2Config's 1536 applies (a low-rank query pair the checkpoint lacks:
    refused as missing tensors, not prepared as a direct projection); without topk_method, greedy."""
    def drop(config):
        del config["topk_method"], config["q_lora_rank"]

    with pytest.raises(Exception, match="q_a_proj"):
        load_checkpoint(rewritten_checkpoint(lite[2], tmp_path, drop))
    recipe = load_checkpoint(rewritten_checkpoint(lite[2], tmp_path / "b", lambda c: c.pop("topk_method")))
    assert recipe.architecture.moe.num_groups == 1


@pytest.mark.parametrize("change,message", [
    ({"norm_topk_prob": True}, "norm_topk_prob"),
    ({"moe_layer_freq": 2}, "moe_layer_freq"),
    ({"topk_method": "noaux_tc"}, "topk_method"),
    ({"scoring_func": "sigmoid"}, "scoring_func"),
    ({"topk_method": "group_limited_greedy", "n_group": None, "topk_group": None}, "n_group"),
    ({"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 3}, "topk_group"),
    ({"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1}, "n_group 4"),
    ({"topk_method": "group_limited_greedy", "n_group": 6, "topk_group": 1}, "num_experts_per_tok 2"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0}}, "rope_type"),
    ({"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_configs_are_refused_by_name(lite, tmp_path, change, message):
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(lite[2], tmp_path, lambda config: config.update(change)))
