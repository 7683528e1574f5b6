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

from helios.ignition.architecture import CheckpointError, weight_layout
from helios.ignition.program_spec import Operation
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.defaults import REFERENCE_DEFAULTS
from helios.ignition.recipes.nemotron_h import paired_blocks

from . import test_equivalence as equivalence
from .driver import PagedModel, Sequence, generate
from .hf_checkpoints import NEMOTRON_H, rewritten_checkpoint
from .test_granitemoehybrid_recipe import prepare_hybrid


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare_hybrid(NEMOTRON_H, tmp_path_factory.mktemp("nemotron-h"))


def test_a_chunked_prompt_and_its_greedy_tokens_match_transformers(prepared):
    prompt = equivalence.random_prompt(19, seed=3)
    model = PagedModel(prepared.recipe.weight_tensors, prepared.programs)
    sequence = Sequence(0, list(prompt))
    generate(model, [sequence], equivalence.NEW_TOKENS, chunk=7)  # three chunks: state carried between them
    assert model.operations_run[:3] == [Operation.PREFILL] * 3
    equivalence.assert_matches_reference(prepared, sequence, prompt)


def test_a_continuous_batch_of_different_lengths_matches_transformers(prepared):
    equivalence.test_continuous_batch_of_different_lengths_matches(prepared)


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


def test_config_defaults_are_the_config_class_defaults():
    reference = transformers.NemotronHConfig()
    for key, value in REFERENCE_DEFAULTS["NemotronHForCausalLM"].items():
        assert value == getattr(reference, key), key


REFUSED = {
    "moe blocks": (dict(layers_block_type=["linear_attention", "moe", "full_attention", "mlp"] + ["mlp"] * 2), "moe"),
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
