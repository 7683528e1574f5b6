"""The SmolLM3 recipe against transformers' SmolLM3ForCausalLM on tiny random float32 checkpoints.

Two shapes (tests/ignition/hf_checkpoints.py): a NoPE middle layer that slides (the window
SmolLM3Config derives for NoPE layers), untied; and a tied one with q/k/v/o biases, llama3 rope and
the last layer NoPE by ``no_rope_layer_interval``. Prefill logits, scored log-probabilities, greedy
tokens, batches and prefix-cache continuations equal the reference's (test_equivalence's checks and
tolerances). A terse config.json prepares the model the reference loads (its class defaults);
NoPE and window settings the reference reads otherwise or refuses are refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.architecture import Architecture, CheckpointError
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import (SMOLLM3, SMOLLM3_FAMILIES, SMOLLM3_TIED, assert_refused, random_model,
                             rewritten_checkpoint, write_checkpoint)


@pytest.fixture(scope="module", params=SMOLLM3_FAMILIES, ids=lambda family: family.name)
def prepared(request, prepare):
    return prepare(request.param)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_nope_layers_and_windows_are_the_references(prepared):
    arch, reference = prepared.recipe.architecture, prepared.reference
    uses_rope = [bool(layer.self_attn.use_rope) for layer in reference.model.layers]
    assert [arch.is_rotary(layer) for layer in range(arch.num_layers)] == uses_rope
    windows = [layer.self_attn.sliding_window or 0 for layer in reference.model.layers]
    assert list(arch.layer_windows) == windows
    if prepared.family is SMOLLM3:
        assert arch.nope_layers == (1,) and arch.layer_windows == (0, 6, 0) and not arch.tie_word_embeddings
    else:
        assert arch.nope_layers == (2,) and arch.layer_windows == (0, 0, 0) and arch.tie_word_embeddings
        assert arch.qkv_bias and arch.o_bias


def test_nope_layers_need_plain_attention_layers():
    shape = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2, num_kv_heads=2,
                 head_dim=4, rms_norm_eps=1e-6, layer_windows=(0, 0))
    assert Architecture(**shape, nope_layers=(1,)).is_rotary(0)
    with pytest.raises(CheckpointError, match="NoPE layers"):
        Architecture(**shape, nope_layers=(2,))


# ---------------------------------------------------------------------------------------------------
# config.json: the reference's defaults, and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(SMOLLM3_TIED, seed=4), tmp_path_factory.mktemp("smollm3"))


def test_a_terse_config_is_read_with_the_references_defaults(checkpoint, tmp_path):
    """No rope theta (2e6), key/value head count (4), tied embeddings (tied), NoPE list (every 4th
    layer: none of 3) or layer types: the reference's class defaults, which the recipe fills in."""
    def terse(config):
        for key in ("no_rope_layers", "no_rope_layer_interval", "layer_types", "tie_word_embeddings",
                    "num_key_value_heads"):
            config.pop(key)
        config["num_attention_heads"] = 8
        config["rope_parameters"] = {"rope_type": "default"}

    directory = rewritten_checkpoint(checkpoint, tmp_path, terse)
    arch = load_checkpoint(directory).architecture
    assert (arch.num_kv_heads, arch.nope_layers, arch.tie_word_embeddings) == (4, (), True)
    config = transformers.AutoConfig.from_pretrained(directory)
    reference = transformers.models.smollm3.modeling_smollm3.SmolLM3RotaryEmbedding(config)
    assert torch.equal(dict(load_checkpoint(directory).weights)["rope.inv_freq"], reference.inv_freq)
    assert config.num_key_value_heads == 4 and config.no_rope_layers == [1, 1, 1]


REFUSED = {
    "a short NoPE list": (lambda c: c.update(no_rope_layers=[1, 0]), "no_rope_layers"),
    "a NoPE flag of 2": (lambda c: c.update(no_rope_layers=[1, 2, 1]), "no_rope_layers"),
    "a NoPE string": (lambda c: c.update(no_rope_layers="1,0,1"), "no_rope_layers"),
    "a NoPE interval of 0": (lambda c: c.update(no_rope_layers=None, no_rope_layer_interval=0),
                             "no_rope_layer_interval"),
    "sliding layers without use_sliding_window": (
        lambda c: c.update(sliding_window=4, use_sliding_window=False,
                           layer_types=["full_attention", "sliding_attention", "full_attention"]),
        "use_sliding_window"),
    "sliding layers without a window": (
        lambda c: c.update(sliding_window=None, use_sliding_window=True,
                           layer_types=["full_attention", "sliding_attention", "full_attention"]),
        "sliding_window"),
    "null head_dim": (lambda c: c.update(head_dim=None), "head_dim"),
    "dynamic rope": (lambda c: c.update(rope_parameters={"rope_type": "dynamic", "factor": 2.0}), "rope_type"),
    "partial rotary": (lambda c: c["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "gelu": (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_settings_the_recipe_does_not_implement_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


def test_a_longer_nope_list_is_read_for_the_layers_there_are(checkpoint, tmp_path):
    """SmolLM3Attention indexes the list by layer: flags past the last layer are never read."""
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda c: c.update(no_rope_layers=[0, 1, 1, 0, 0]))
    assert load_checkpoint(directory).architecture.nope_layers == (0,)


def test_a_drafts_history_write_leaves_a_last_nope_layer_unrotated(prepare):
    """A draft's history writes (`draft.write_keys`: the last layer only projects and writes its keys)
    cache the keys the decoder caches, here where that last layer is NoPE."""
    from helios.ignition.decoder import PackedStep, decoder_hidden, slot_mapping
    from helios.ignition.draft import DraftStorage, write_keys

    recipe = prepare(SMOLLM3_TIED).recipe
    arch, weights = recipe.architecture, dict(recipe.weights)
    assert arch.nope_layers == (arch.num_layers - 1,)
    positions, page_tokens = torch.arange(7), 4
    query_start, table = torch.tensor([0, 7], dtype=torch.int32), torch.tensor([[1, 0]], dtype=torch.int32)
    step = PackedStep(torch.tensor(equivalence.random_prompt(7, seed=5)), positions, query_start, table,
                      slot_mapping(query_start, table, positions, page_tokens))
    shape = (arch.num_layers, 2, page_tokens, arch.num_kv_heads, arch.head_dim)
    decoded, drafted = [torch.zeros(shape) for _ in range(2)], [torch.zeros(shape) for _ in range(2)]
    decoder_hidden(arch, weights, *decoded, step)
    write_keys(arch, weights, DraftStorage(*drafted, table), step)
    assert drafted[0].abs().sum() > 0
    torch.testing.assert_close(drafted, decoded, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("sliding", [False, True])
def test_the_released_shape_gets_the_references_nope_layers_and_windows(sliding):
    """SmolLM3-3B's config.json shape (36 layers, NoPE every 4th by the interval rule; no weights):
    the rotary and window of each layer SmolLM3Config derives, with and without a sliding window."""
    from helios.ignition.recipes.defaults import with_reference_defaults
    from helios.ignition.recipes.llama import layer_windows
    from helios.ignition.recipes.smollm3 import layer_types, rotary_layers

    config = dict(hidden_size=2048, num_attention_heads=16, num_hidden_layers=36, rope_theta=5000000.0,
                  use_sliding_window=sliding, sliding_window=4096 if sliding else None)
    reference = transformers.SmolLM3Config(**config)
    ours = with_reference_defaults("SmolLM3ForCausalLM", config)
    rotary = rotary_layers(ours, 36)
    assert [int(rotates) for rotates in rotary] == reference.no_rope_layers
    kinds = layer_types(ours, rotary)
    assert kinds == reference.layer_types
    windows = layer_windows("SmolLM3ForCausalLM", {**ours, "layer_types": kinds}, 36)
    assert windows == tuple(4096 if sliding and (i + 1) % 4 == 0 else 0 for i in range(36))
