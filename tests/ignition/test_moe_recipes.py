"""The mixture-of-experts recipe: architecture fields, stacked expert weights (per-expert and fused
checkpoint layouts), GLM's skipped multi-token-prediction layers, and refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.errors import UsageError
from helios.ignition.architecture import MixtureOfExperts, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from .hf_checkpoints import GLM4_MOE, MIXTRAL, MOE_FAMILIES, QWEN3_MOE, random_model, write_checkpoint

EXPECTED = {  # family: (intermediate_size, head_dim, qk_norm, qkv_bias, moe)
    QWEN3_MOE.name: (96, 32, True, False, MixtureOfExperts(8, 3, 48, (1, 3), normalize=True)),
    MIXTRAL.name: (0, 16, False, False, MixtureOfExperts(6, 2, 64, (0, 1), normalize=True)),
    GLM4_MOE.name: (96, 16, True, True, MixtureOfExperts(
        8, 3, 32, (2, 3), scoring="sigmoid", num_groups=4, topk_groups=2, normalize=True, scale=2.5,
        correction_bias=True, shared_intermediate_size=32)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    built = {}
    for family in MOE_FAMILIES:
        model = random_model(family)
        built[family.name] = (model, write_checkpoint(model, tmp_path_factory.mktemp(family.name)))
    return built


@pytest.mark.parametrize("family", MOE_FAMILIES, ids=lambda family: family.name)
def test_architecture_fields_come_from_the_config(checkpoints, family):
    arch = load_checkpoint(checkpoints[family.name][1]).architecture
    assert (arch.intermediate_size, arch.head_dim, arch.qk_norm, arch.qkv_bias, arch.moe) == EXPECTED[family.name]


@pytest.mark.parametrize("family", MOE_FAMILIES, ids=lambda family: family.name)
def test_expert_weights_are_stacked_in_program_layout(checkpoints, family):
    model, directory = checkpoints[family.name]
    recipe = load_checkpoint(directory)
    weights = dict(recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(recipe.architecture)]
    last = recipe.architecture.num_layers - 1
    block = model.model.layers[last].mlp
    assert torch.equal(weights[f"layers.{last}.experts.gate_up"], block.experts.gate_up_proj)
    assert torch.equal(weights[f"layers.{last}.experts.down"], block.experts.down_proj)
    assert torch.equal(weights[f"layers.{last}.router.weight"], block.gate.weight)
    assert weights[f"layers.{last}.router.weight"].dtype == torch.float32
    reference_freq = model.model.rotary_emb.inv_freq  # GLM rotates half of each head: zeros past its frequencies
    assert torch.equal(weights["rope.inv_freq"][: len(reference_freq)], reference_freq)
    assert not weights["rope.inv_freq"][len(reference_freq):].any()
    if family is GLM4_MOE:
        assert torch.equal(weights["layers.3.router.correction_bias"], block.gate.e_score_correction_bias)
        shared = block.shared_experts
        assert torch.equal(weights["layers.3.shared.gate_up.weight"],
                           torch.cat([shared.gate_proj.weight, shared.up_proj.weight]))
        assert "layers.1.gate_up.weight" in weights and "layers.1.experts.gate_up" not in weights


@pytest.mark.parametrize("head_dim, rotary", [(16, 8), (128, 64), (12, 4), (8, 8)])
def test_reordered_whole_head_rotary_is_the_partial_rotary(head_dim, rotary):
    """transformers' partial rotary then q.k equals, after `rotary_order`, the whole-head rotary with
    zero frequencies past the rotated ones (the decoder's rotary and its fused kernel)."""
    from transformers.models.glm4_moe.modeling_glm4_moe import apply_rotary_pos_emb

    from helios.abi.fused import apply_rotary
    from helios.ignition.decoder import rotary_tables
    from helios.ignition.recipes.moe import rotary_order

    generator = torch.Generator().manual_seed(head_dim)
    q, k = torch.randn(2, 5, 3, head_dim, generator=generator, dtype=torch.float64)  # [tokens, heads, D] each
    positions = torch.tensor([0, 3, 7, 100, 2048])
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, rotary, 2, dtype=torch.float32) / rotary)
    angles = torch.cat([positions[:, None].float() * inv_freq[None, :]] * 2, dim=-1)  # float32, as both compute them
    cos_hf, sin_hf = angles.cos().double(), angles.sin().double()
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf, unsqueeze_dim=1)
    padded = torch.zeros(head_dim // 2, dtype=torch.float32)
    padded[: rotary // 2] = inv_freq
    cos, sin = rotary_tables(positions, padded, torch.float64)
    order = rotary_order(head_dim, rotary)
    assert sorted(order.tolist()) == list(range(head_dim))
    q_ours, k_ours = apply_rotary(q[..., order], cos, sin), apply_rotary(k[..., order], cos, sin)
    torch.testing.assert_close(q_ours @ k_ours.transpose(-1, -2), q_hf @ k_hf.transpose(-1, -2))
    torch.testing.assert_close(q_ours, q_hf[..., order])


def _copy(checkpoints, tmp_path, family):
    shutil.copytree(checkpoints[family.name][1], tmp_path, dirs_exist_ok=True)
    return tmp_path


def _edit(directory, edit_tensors=None, **config_changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(config_changes)
    (directory / "config.json").write_text(json.dumps(config))
    if edit_tensors:
        tensors = load_file(directory / "model.safetensors")
        edit_tensors(tensors)
        save_file(tensors, directory / "model.safetensors")


def test_fused_expert_tensors_give_the_same_weights(checkpoints, tmp_path):
    expected = dict(load_checkpoint(checkpoints[QWEN3_MOE.name][1]).weights)

    def fuse(tensors):
        for layer in (1, 3):
            prefix = f"model.layers.{layer}.mlp.experts."
            gate_up = [torch.cat([tensors.pop(f"{prefix}{e}.gate_proj.weight"), tensors.pop(f"{prefix}{e}.up_proj.weight")])
                       for e in range(8)]
            tensors[prefix + "gate_up_proj"] = torch.stack(gate_up)
            tensors[prefix + "down_proj"] = torch.stack([tensors.pop(f"{prefix}{e}.down_proj.weight") for e in range(8)])

    directory = _copy(checkpoints, tmp_path, QWEN3_MOE)
    _edit(directory, fuse)
    weights = dict(load_checkpoint(directory).weights)
    assert weights.keys() == expected.keys()
    assert all(torch.equal(weights[name], expected[name]) for name in weights)


def test_glm_multi_token_prediction_layers_are_skipped_only_when_declared(checkpoints, tmp_path):
    directory = _copy(checkpoints, tmp_path, GLM4_MOE)
    _edit(directory, lambda tensors: tensors.update({"model.layers.4.eh_proj.weight": torch.zeros(2, 2)}))
    assert load_checkpoint(directory).architecture.num_layers == 4
    _edit(directory, num_nextn_predict_layers=0)
    with pytest.raises(UnsupportedCheckpoint, match="eh_proj"):
        load_checkpoint(directory)


@pytest.mark.parametrize("family, changes, message", [
    (QWEN3_MOE, {"mlp_only_layers": [0, 1, 2, 3]}, "without sparse layers"),
    (QWEN3_MOE, {"num_experts_per_tok": 9}, "9 experts per token of 8"),
    (GLM4_MOE, {"n_group": 3}, "do not form 3 groups"),
    (GLM4_MOE, {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.3125}},
     "rotary width of 5 of head_dim 16"),
    (MIXTRAL, {"hidden_act": "gelu"}, "hidden_act"),
])
def test_unsupported_settings_are_refused(checkpoints, tmp_path, family, changes, message):
    directory = _copy(checkpoints, tmp_path, family)
    _edit(directory, **changes)
    with pytest.raises(UsageError, match=message):
        load_checkpoint(directory)


def test_a_missing_expert_is_refused_by_name(checkpoints, tmp_path):
    directory = _copy(checkpoints, tmp_path, MIXTRAL)
    _edit(directory, lambda tensors: tensors.pop("model.layers.1.block_sparse_moe.experts.5.w3.weight"))
    with pytest.raises(UsageError, match="experts.5.w3.weight"):
        load_checkpoint(directory)
