"""The Nemotron-H recipe (NemotronHForCausalLM) against transformers on a tiny random float32
checkpoint whose blocks are Mamba2, MLP, attention, Mamba2, Mamba2, MLP (tests/ignition/hf_checkpoints.py):
Helios layers pair a Mamba2 or attention block with the MLP block after it, and the attention and the
middle Mamba2 block become layers without an MLP.

Captured hybrid programs give the reference's logits and greedy tokens for a prompt prefilled in
chunks (crossing the reference's Mamba2 chunk of 8 tokens) and decoded with the carried state, and
for a continuous batch of different lengths; the layout pairs the blocks' norms and projections; the
legacy pattern string, the ``model.`` tensor prefix and multi-token prediction tensors prepare the
same model; unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.nemotron_h import paired_blocks

from . import test_equivalence as equivalence
from .hf_checkpoints import NEMOTRON_H, NEMOTRON_H_MOE, random_model, rewritten_checkpoint, write_checkpoint
from .test_granitemoehybrid_recipe import assert_chunked_prompt_matches, prepared_once


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepared_once(NEMOTRON_H, tmp_path_factory)


@pytest.fixture(scope="module")
def with_experts(tmp_path_factory):
    return prepared_once(NEMOTRON_H_MOE, tmp_path_factory)


@pytest.fixture(scope="module", params=[NEMOTRON_H, NEMOTRON_H_MOE], ids=lambda family: family.name)
def either(request, tmp_path_factory):
    return prepared_once(request.param, tmp_path_factory)


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(either):
    assert_chunked_prompt_matches(either)


def test_a_continuous_batch_of_different_lengths_matches_transformers(either):
    equivalence.test_continuous_batch_of_different_lengths_matches(either)


def test_the_experts_layout_and_two_ranks_sum_to_the_one_rank_block(with_experts):
    """Non-gated relu2 experts stacked from their per-expert tensors, the router's float32 weight and
    choice bias, the relu2 shared expert; each of two ranks' experts.up / shared.up rows and down
    columns, summed, give the one-rank block."""
    from helios.ignition.decoder import moe_block
    from helios.ignition.sharding import rank_architecture, rank_weights

    recipe, arch = with_experts.recipe, with_experts.recipe.architecture
    weights, state = dict(recipe.weights), with_experts.reference.state_dict()
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(8, 2, 32, (0, 2), scoring="sigmoid", num_groups=2, topk_groups=1, scale=2.5,
                                        correction_bias=True, activation="relu2", shared_intermediate_size=48)
    assert arch.mlp_free_layers == () and arch.intermediate_size == 96 and not arch.gated_mlp
    moe = "model.layers.5.mixer."
    assert torch.equal(weights["layers.2.experts.up"], state[moe + "experts.up_proj"])
    assert torch.equal(weights["layers.2.experts.down"], state[moe + "experts.down_proj"])
    assert torch.equal(weights["layers.2.router.correction_bias"], state[moe + "gate.e_score_correction_bias"])
    assert torch.equal(weights["layers.2.shared.up.weight"], state[moe + "shared_experts.up_proj.weight"])
    assert torch.equal(weights["layers.2.post_norm"], state["model.layers.5.norm.weight"])
    hidden = torch.randn(5, arch.hidden_size, generator=torch.Generator().manual_seed(0))
    shard = rank_architecture(arch, 2)
    total = sum(moe_block(shard, dict(rank_weights(recipe, 2, rank)), "layers.0.", hidden).value for rank in range(2))
    torch.testing.assert_close(total, moe_block(arch, weights, "layers.0.", hidden))


def test_the_layout_pairs_each_mixer_block_with_the_mlp_block_after_it(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    state = {name.removeprefix("model."): tensor for name, tensor in prepared.reference.state_dict().items()}
    assert [name for name in weights] == [slot.name for slot in weight_layout(arch)]
    assert arch.num_layers == 4 and arch.recurrent.layers == (0, 2, 3) and arch.mlp_free_layers == (1, 2)
    assert arch.recurrent.intermediate == 96 and arch.recurrent.proj_bias and not arch.gated_mlp
    assert torch.equal(weights["layers.3.input_norm"], state["layers.4.norm.weight"])
    assert torch.equal(weights["layers.3.post_norm"], state["layers.5.norm.weight"])
    assert torch.equal(weights["layers.3.up.weight"], state["layers.5.mixer.up_proj.weight"])
    assert torch.equal(weights["layers.0.down.bias"], state["layers.1.mixer.down_proj.bias"])
    assert torch.equal(weights["layers.2.mixer.in_proj.weight"], state["layers.3.mixer.in_proj.weight"])
    mixer = "layers.2.mixer."
    qkv = torch.cat([state[mixer + name + "_proj.weight"] for name in "qkv"])
    assert torch.equal(weights["layers.1.qkv.weight"], qkv) and "layers.1.post_norm" not in weights
    assert torch.equal(weights["final_norm"], state["norm_f.weight"]) and not torch.any(weights["rope.inv_freq"])


def test_blocks_pair_as_the_module_says():
    kinds = ("linear_attention", "linear_attention", "full_attention", "mlp", "linear_attention", "mlp",
             "linear_attention")
    assert paired_blocks(kinds) == ((0, None), (1, None), (2, 3), (4, 5), (6, None))


def _edited(prepared, tmp_path, edit):
    return rewritten_checkpoint(prepared.directory, tmp_path, edit)


def test_the_legacy_pattern_and_spellings_prepare_the_same_model(prepared, tmp_path):
    def edit(config):
        del config["layers_block_type"]
        config.update(hybrid_override_pattern="M-*MM-", mamba_n_groups=config.pop("n_groups"),
                      mamba_d_conv=config.pop("conv_kernel"))

    assert load_checkpoint(_edited(prepared, tmp_path, edit)).architecture == prepared.recipe.architecture


def test_model_prefixed_and_multi_token_prediction_tensors(prepared, tmp_path):
    """transformers' in-memory ``model.`` names prepare the same weights; ``mtp.`` tensors are skipped."""
    checkpoint = _edited(prepared, tmp_path, lambda config: None)
    tensors = load_file(checkpoint / "model.safetensors")
    renamed = {name.replace("backbone.", "model.", 1): tensor for name, tensor in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file({**renamed, "mtp.layers.0.norm.weight": torch.ones(64)}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    weights = dict(load_checkpoint(checkpoint).weights)
    assert all(torch.equal(tensor, weights[name]) for name, tensor in prepared.recipe.weights)
    save_file({**renamed, "model.layers.2.mixer.q_norm.weight": torch.ones(16)}, checkpoint / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="q_norm"):
        load_checkpoint(checkpoint)


def test_latent_experts_match_transformers_and_sum_over_two_ranks(tmp_path):
    """moe_latent_size (Nemotron 3 Super's latent experts): the experts work in 24 dims between the
    fc1 / fc2 latent projections; prefill logits equal the reference's, two ranks' blocks sum to one's."""
    from helios.ignition.decoder import moe_block
    from helios.ignition.sharding import rank_architecture, rank_weights

    family = dataclasses.replace(NEMOTRON_H_MOE, name="nemotron_h_latent", overrides=(
        *NEMOTRON_H_MOE.overrides, ("moe_latent_size", 24)))
    reference = random_model(family)
    recipe = load_checkpoint(write_checkpoint(reference, tmp_path / "checkpoint"))
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert arch.moe.latent_size == 24 and weights["layers.0.experts.up"].shape == (8, 32, 24)
    prompt = equivalence.random_prompt(19, seed=5)
    ours = equivalence.prefill_logits(arch, recipe.weight_tensors, prompt)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    assert equivalence.relative_error(ours, expected) < equivalence.TOLERANCE
    hidden = torch.randn(5, arch.hidden_size, generator=torch.Generator().manual_seed(0))
    shard = rank_architecture(arch, 2)
    total = sum(moe_block(shard, dict(rank_weights(recipe, 2, rank)), "layers.0.", hidden).value for rank in range(2))
    torch.testing.assert_close(total, moe_block(arch, weights, "layers.0.", hidden))


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.NemotronHConfig()
    for key, value in REFERENCE_DEFAULTS["NemotronHForCausalLM"].items():
        assert value == getattr(reference, key), key


REFUSED = {
    "experts beside MLP biases": (dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                                                          "linear_attention", "mlp"]), "mlp_bias"),
    "an MLP block first": (dict(layers_block_type=["mlp", "linear_attention", "full_attention", "linear_attention",
                                                   "linear_attention", "mlp"]), "block 0"),
    "two MLP blocks in a row": (dict(layers_block_type=["linear_attention", "mlp", "mlp", "full_attention",
                                                        "linear_attention", "mlp"]), "block 2"),
    "no attention block": (dict(layers_block_type=["linear_attention", "mlp"] * 3), "attention"),
    "a block kind": (dict(layers_block_type=["linear_attention", "mlp", "sliding_attention", "linear_attention",
                                             "linear_attention", "mlp"]), "layers_block_type"),
    "a pattern character": (dict(layers_block_type=None, hybrid_override_pattern="M-*MX-"), "hybrid_override_pattern"),
    "another MLP activation": (dict(mlp_hidden_act="silu"), "mlp_hidden_act"),
    "another mixer activation": (dict(mamba_hidden_act="gelu"), "mamba_hidden_act"),
    "mixer groups": (dict(n_groups=3), "groups"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_settings_are_refused_by_name(prepared, tmp_path, case):
    changes, setting = REFUSED[case]

    def edit(config):
        config.update(changes)
        if config.get("layers_block_type") is None:
            del config["layers_block_type"]

    with pytest.raises(CheckpointError, match=setting):
        load_checkpoint(_edited(prepared, tmp_path, edit))


def test_mlp_free_layers_must_be_dense_layers_of_a_hybrid_decoder(prepared):
    arch = prepared.recipe.architecture
    for changes in (dict(mlp_free_layers=(4,)), dict(recurrent=None, mlp_free_layers=(1,))):
        with pytest.raises(CheckpointError, match="mlp_free_layers"):
            dataclasses.replace(arch, **changes)
