"""The GPT-NeoX recipe against transformers' GPTNeoXForCausalLM on tiny random float32 checkpoints.

The shape (tests/ignition/hf_checkpoints.py): multi-head attention through the per-head fused q/k/v, biased
LayerNorms, the parallel residual whose MLP reads its own norm, the non-gated exact-GELU MLP, partial rotary (half
of each head), untied. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached
prefix pages) equal the reference's (test_equivalence's checks and tolerances); the fused q/k/v rows land as the
reference's q, k and v; the MLP's own norm matters; the sequential block equals the reference's prefill logits;
a legacy config.json (rotary_pct, rotary_emb_base, embed_out, the mask buffers) prepares the reference's model;
unsupported settings are refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import load_checkpoint
from helios.ignition.recipes.moe import rotary_order

from . import test_equivalence as equivalence
from .hf_checkpoints import GPT_NEOX, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GPT_NEOX)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_fused_qkv_rows_are_the_references_q_k_and_v(prepared):
    weights, model = dict(prepared.recipe.weights), prepared.reference.gpt_neox
    arch, layer = prepared.recipe.architecture, model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.parallel_block and arch.parallel_mlp_norm and arch.num_kv_heads == arch.num_heads == 4
    assert not arch.gated_mlp and arch.mlp_activation == "gelu" and arch.qkv_bias and arch.o_bias
    fused = layer.attention.query_key_value.weight.reshape(4, 3, 16, 64)
    order = rotary_order(16, 8)
    q, k, v = weights["layers.1.qkv.weight"].split(64)
    assert torch.equal(q.reshape(4, 16, 64), fused[:, 0][:, order])
    assert torch.equal(k.reshape(4, 16, 64), fused[:, 1][:, order])
    assert torch.equal(v.reshape(4, 16, 64), fused[:, 2])
    assert torch.equal(weights["layers.1.post_norm_bias"], layer.post_attention_layernorm.bias)


def test_the_mlps_own_norm_matters(prepared):
    """The MLP reading input_norm's output (Phi's parallel block) moves the logits by more than ten times the
    tolerance."""
    shared = dataclasses.replace(prepared.recipe.architecture, parallel_mlp_norm=False)
    equivalence.assert_change_matters(prepared, equivalence.random_prompt(13, seed=1), arch=shared,
                                      weights=equivalence.layout_tensors(prepared.recipe, shared))


def _eager_check(reference, directory) -> None:
    recipe = load_checkpoint(directory)
    prompt = equivalence.random_prompt(13, seed=1)
    with torch.no_grad():
        expected = reference(torch.tensor([prompt])).logits[0, -1]
    logits = equivalence.prefill_logits(recipe.architecture, recipe.weight_tensors, prompt)
    assert equivalence.relative_error(logits, expected) < equivalence.TOLERANCE


def test_the_sequential_block_equals_the_reference(tmp_path):
    overrides = dict(GPT_NEOX.overrides) | {"use_parallel_residual": False, "hidden_act": "gelu_new"}
    family = dataclasses.replace(GPT_NEOX, name="gpt_neox-sequential", overrides=tuple(overrides.items()))
    reference = random_model(family, seed=2)
    directory = write_checkpoint(reference, tmp_path / "sequential")
    arch = load_checkpoint(directory).architecture
    assert not arch.parallel_block and arch.mlp_activation == "gelu_tanh"
    _eager_check(reference, directory)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(GPT_NEOX, seed=4), tmp_path_factory.mktemp("gpt_neox-checkpoint"))


def test_a_legacy_config_prepares_the_references_model(checkpoint, tmp_path):
    """rotary_pct / rotary_emb_base instead of rope_parameters (a top-level rope_theta is not read) and the old
    causal-mask buffers in the weights (Pythia's layout); the head under transformers' own name, lm_head."""
    def edit(config):
        config.pop("rope_parameters")
        config.update(rotary_pct=0.25, rotary_emb_base=50, rope_theta=7.0)

    directory = rewritten_checkpoint(checkpoint, tmp_path, edit)
    for path in directory.glob("*.safetensors"):
        tensors = load_file(path)
        tensors["lm_head.weight"] = tensors.pop("embed_out.weight")
        tensors["gpt_neox.layers.0.attention.masked_bias"] = torch.tensor(-1e9)
        tensors["gpt_neox.layers.1.attention.bias"] = torch.ones(1, 1, 8, 8, dtype=torch.bool).tril()
        save_file(tensors, path, metadata={"format": "pt"})
    reference = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    assert reference.config.rope_parameters["rope_theta"] == 50
    assert dict(load_checkpoint(directory).weights)["rope.inv_freq"][2:].count_nonzero() == 0
    _eager_check(reference, directory)


REFUSED = {
    "another activation": (lambda config: config.update(hidden_act="relu6"), "hidden_act"),
    "dynamic rope": (lambda config: config["rope_parameters"].update(rope_type="dynamic"), "rope_type"),
    "an odd rotary width": (lambda config: config["rope_parameters"].update(partial_rotary_factor=0.2),
                            "partial_rotary_factor"),
    "a null layer_norm_eps": (lambda config: config.update(layer_norm_eps=None), "layer_norm_eps"),
    "a head_dim that resizes the rotary table": (lambda config: config.update(head_dim=8), "head_dim"),
    "heads that do not divide": (lambda config: config.update(num_attention_heads=3), "num_attention_heads"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_gpt_neox_settings_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


def test_the_parallel_mlp_norm_needs_the_parallel_block(prepared):
    from helios.ignition.architecture import CheckpointError

    with pytest.raises(CheckpointError, match="parallel_mlp_norm"):
        dataclasses.replace(prepared.recipe.architecture, parallel_block=False)
