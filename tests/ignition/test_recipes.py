"""The Llama-family recipe (dense families; tests/ignition/test_moe_recipes.py has the MoE ones): architecture fields, prepared weight layout, rope scaling, and refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from helios.errors import UsageError
from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import SUPPORTED_ARCHITECTURES, UnsupportedCheckpoint, load_checkpoint
from helios.ignition.recipes.llama import rope_inv_freq

from .hf_checkpoints import DENSE_FAMILIES, LLAMA2, LLAMA3, MISTRAL, QWEN2, QWEN3, random_model, write_checkpoint

EXPECTED = {  # family: (num_kv_heads, head_dim, layer_windows, qkv_bias, o_bias, mlp_bias, qk_norm, tied)
    LLAMA2.name: (4, 16, (0, 0), True, True, True, False, False),
    LLAMA3.name: (2, 16, (0, 0), False, False, False, False, True),
    MISTRAL.name: (2, 16, (8, 8), False, False, False, False, False),
    QWEN2.name: (2, 16, (0, 6), True, False, False, False, True),
    QWEN3.name: (2, 32, (0, 0), False, False, False, True, False),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{family name: (reference model, checkpoint directory)} for every family."""
    built = {}
    for family in DENSE_FAMILIES:
        model = random_model(family)
        built[family.name] = (model, write_checkpoint(model, tmp_path_factory.mktemp(family.name)))
    return built


@pytest.mark.parametrize("family", DENSE_FAMILIES, ids=lambda family: family.name)
def test_architecture_fields_come_from_the_checkpoint(checkpoints, family):
    arch = load_checkpoint(checkpoints[family.name][1]).architecture
    fields = (arch.num_kv_heads, arch.head_dim, arch.layer_windows, arch.qkv_bias, arch.o_bias,
              arch.mlp_bias, arch.qk_norm, arch.tie_word_embeddings)
    assert fields == EXPECTED[family.name]
    assert (arch.vocab_size, arch.hidden_size, arch.num_layers, arch.num_heads) == (128, 64, 2, 4)


@pytest.mark.parametrize("family", DENSE_FAMILIES, ids=lambda family: family.name)
def test_weights_are_fused_in_program_layout(checkpoints, family):
    model, directory = checkpoints[family.name]
    recipe = load_checkpoint(directory)
    weights = dict(recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(recipe.architecture)]
    attention, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    fused = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])
    assert torch.equal(weights["layers.1.qkv.weight"], fused)
    assert torch.equal(weights["layers.1.gate_up.weight"], torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert ("lm_head" in weights) is not recipe.architecture.tie_word_embeddings
    assert torch.equal(weights["rope.inv_freq"], model.model.rotary_emb.inv_freq)  # rope scaling included


def test_legacy_rope_fields_give_the_same_frequencies():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    current = {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **scaling}}
    legacy = {"rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **scaling}}
    assert torch.equal(rope_inv_freq(current, 16), rope_inv_freq(legacy, 16))
    plain = rope_inv_freq({"rope_theta": 500000.0}, 16)
    assert not torch.equal(plain, rope_inv_freq(legacy, 16))
    linear = rope_inv_freq({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, 16)
    assert torch.equal(linear, plain / 2.0)


def test_dtype_override_casts_every_weight_but_rope(checkpoints):
    recipe = load_checkpoint(checkpoints[QWEN3.name][1], dtype="bfloat16")
    assert recipe.architecture.dtype == "bfloat16"
    dtypes = {name: tensor.dtype for name, tensor in recipe.weights}
    assert dtypes.pop("rope.inv_freq") == torch.float32
    assert set(dtypes.values()) == {torch.bfloat16}


def _copy(checkpoints, tmp_path, family=LLAMA3):
    directory = checkpoints[family.name][1]
    for path in directory.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    return tmp_path


def _edit_config(directory, **changes):
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def test_unsupported_architecture_lists_the_supported_ones(checkpoints, tmp_path):
    directory = _copy(checkpoints, tmp_path)
    _edit_config(directory, architectures=["GPT2LMHeadModel"])
    with pytest.raises(UnsupportedCheckpoint) as raised:
        load_checkpoint(directory)
    assert isinstance(raised.value, UsageError)
    assert "GPT2LMHeadModel" in str(raised.value)
    assert all(name in str(raised.value) for name in SUPPORTED_ARCHITECTURES)
    assert set(SUPPORTED_ARCHITECTURES) == {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                                            "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM",
                                            "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM",
                                            "BambaForCausalLM", "Qwen3NextForCausalLM", "Qwen3_5ForCausalLM",
                                            "Qwen3_5MoeForCausalLM", "GptOssForCausalLM",
                                            "Qwen2_5_VLForConditionalGeneration",
                                            "Qwen3VLForConditionalGeneration", "Phi3ForCausalLM",
                                            "SmolLM3ForCausalLM", "GemmaForCausalLM", "Gemma2ForCausalLM",
                                            "Gemma3ForCausalLM", "SeedOssForCausalLM",
                                            "Ernie4_5ForCausalLM", "GraniteForCausalLM", "CohereForCausalLM",
                                            "Cohere2ForCausalLM", "Starcoder2ForCausalLM", "PhiForCausalLM",
                                            "HunYuanDenseV1ForCausalLM", "Glm4ForCausalLM", "Olmo2ForCausalLM",
                                            "Olmo3ForCausalLM", "Qwen2MoeForCausalLM", "OlmoeForCausalLM",
                                            "GraniteMoeForCausalLM", "GraniteMoeSharedForCausalLM",
                                            "HunYuanMoEV1ForCausalLM", "Ernie4_5_MoeForCausalLM",
                                            "DeepseekV2ForCausalLM", "Glm4MoeLiteForCausalLM",
                                            "Dots1ForCausalLM", "YoutuForCausalLM",
                                            "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM",
                                            "GraniteMoeHybridForCausalLM", "Llama4ForCausalLM",
                                            "Llama4ForConditionalGeneration", "MiniMaxM2ForCausalLM", "DbrxForCausalLM", "PhimoeForCausalLM",
                                            "NemotronHForCausalLM", "FalconH1ForCausalLM",
                                            "Exaone4ForCausalLM", "ApertusForCausalLM", "ArceeForCausalLM",
                                            "NemotronForCausalLM", "StableLmForCausalLM", "GPTNeoXForCausalLM",
                                            "GlmForCausalLM", "HeliumForCausalLM", "MinistralForCausalLM",
                                            "InternLM3ForCausalLM", "VaultGemmaForCausalLM",
                                            "OlmoForCausalLM", "Ministral3ForCausalLM", "Lfm2ForCausalLM", "Lfm2MoeForCausalLM",
                                            "OlmoHybridForCausalLM", "KimiLinearForCausalLM",
                                            "BailingHybridForCausalLM",
                                            "ExaoneMoeForCausalLM", "SolarOpenForCausalLM",
                                            "AfmoeForCausalLM", "FlexOlmoForCausalLM",
                                            "GraniteSWAForCausalLM", "GraniteMoeSWAForCausalLM",
                                            "CwmForCausalLM", "Jais2ForCausalLM",
                                            "NanoChatForCausalLM", "JetMoeForCausalLM"}


@pytest.mark.parametrize("changes, message", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}}, "rope_type"),
    ({"tie_word_embeddings": False}, "lm_head.weight"),
])
def test_unsupported_settings_are_refused(checkpoints, tmp_path, changes, message):
    directory = _copy(checkpoints, tmp_path)  # Llama 3: tied, so the checkpoint has no lm_head
    _edit_config(directory, **changes)
    with pytest.raises(UsageError, match=message):
        load_checkpoint(directory)


def test_unplaced_tensors_and_missing_safetensors_are_refused(checkpoints, tmp_path):
    directory = _copy(checkpoints, tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["model.layers.0.mlp.extra.weight"] = torch.zeros(2)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(UnsupportedCheckpoint, match="extra"):
        load_checkpoint(directory)
    (directory / "model.safetensors").unlink()
    with pytest.raises(UsageError, match="safetensors"):
        load_checkpoint(directory)
