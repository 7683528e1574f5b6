"""The gpt-oss recipe: architecture fields, the expert weight layout, YaRN, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint
from helios.ignition.sharding import rank_architecture, rank_weights

from .hf_checkpoints import GPT_OSS, random_model, write_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = random_model(GPT_OSS)
    return model, write_checkpoint(model, tmp_path_factory.mktemp(GPT_OSS.name))


def test_architecture_fields_come_from_the_config(checkpoint):
    arch = load_checkpoint(checkpoint[1]).architecture
    assert arch.layer_windows == (6, 0, 6, 0)  # layer_types: sliding, full, sliding, full
    assert (arch.qkv_bias, arch.o_bias, arch.mlp_bias, arch.attention_sinks) == (True, True, False, True)
    experts = arch.moe
    assert (experts.num_experts, experts.experts_per_token, experts.scoring, experts.activation) == (
        4, 2, "topk_softmax", "swiglu_clamped")
    assert experts.sparse_layers == (0, 1, 2, 3) and experts.expert_intermediate_size == 32
    assert arch.intermediate_size == 0
    assert (experts.alpha, experts.limit, experts.router_bias, experts.expert_bias) == (1.702, 1.0, True, True)
    assert arch.rope_attention_factor == pytest.approx(0.1 * torch.log(torch.tensor(8.0)).item() + 1.0)


def test_expert_weights_are_deinterleaved_into_linear_layout(checkpoint):
    model, directory = checkpoint
    recipe = load_checkpoint(directory)
    weights = dict(recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(recipe.architecture)]
    experts = model.model.layers[2].mlp.experts
    hidden = torch.randn(3, 64)
    gate_up = hidden @ experts.gate_up_proj[1] + experts.gate_up_proj_bias[1]  # the reference's product
    ours = torch.nn.functional.linear(hidden, weights["layers.2.experts.gate_up"][1],
                                      weights["layers.2.experts.gate_up_bias"][1])
    torch.testing.assert_close(ours[:, :32], gate_up[:, ::2])
    torch.testing.assert_close(ours[:, 32:], gate_up[:, 1::2])
    assert torch.equal(weights["layers.2.experts.down"][3], experts.down_proj[3].T)
    assert weights["layers.2.sinks"].dtype == torch.float32
    assert torch.equal(weights["layers.2.sinks"], model.model.layers[2].self_attn.sinks)
    assert torch.equal(weights["rope.inv_freq"], model.model.rotary_emb.inv_freq)  # YaRN frequencies


def _copy(directory, tmp_path):
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


def test_quantised_expert_tensors_are_refused(checkpoint, tmp_path):
    directory = _copy(checkpoint[1], tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"] = torch.zeros(2, dtype=torch.uint8)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(UnsupportedCheckpoint, match="gate_up_proj_blocks"):
        load_checkpoint(directory)


def test_unsupported_rope_type_is_refused(checkpoint, tmp_path):
    directory = _copy(checkpoint[1], tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "longrope", "rope_theta": 10000.0}
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedCheckpoint, match="rope_type"):
        load_checkpoint(directory)


def test_tensor_parallel_ranks_hold_their_heads_sinks(checkpoint):
    recipe = load_checkpoint(checkpoint[1])
    whole = dict(recipe.weights)["layers.1.sinks"]
    shares = [dict(rank_weights(recipe, 2, rank))["layers.1.sinks"] for rank in range(2)]
    assert torch.equal(torch.cat(shares), whole) and shares[0].shape == (2,)
    with pytest.raises(CheckpointError, match="heads"):
        rank_architecture(recipe.architecture, 3)
