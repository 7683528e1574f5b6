"""The Hunyuan dense recipe against transformers' HunYuanDenseV1ForCausalLM on a tiny random float32
checkpoint: per-head q/k norms applied after the rotation (not before, as Qwen3's), NTK-alpha rope
("dynamic" with an alpha, a static stretch of the base), q/k/v/o biases. Prefill logits, scored
log-probabilities, greedy tokens, batches and prefix-cache continuations equal the reference's
(test_equivalence's checks and tolerances); a draft's history write norms the rotated keys as the
decoder does; the legacy rope_scaling spelling of the released checkpoints prepares the same model;
what the recipe does not implement is refused by name.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import HUNYUAN, assert_refused, random_model, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(HUNYUAN)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` families."""


def test_the_prepared_norms_and_rope(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    attention = prepared.reference.model.layers[1].self_attn
    assert arch.qk_norm and arch.qk_norm_after_rotary and arch.qkv_bias and arch.o_bias
    assert torch.equal(weights["layers.1.q_norm"], attention.query_layernorm.weight)
    assert torch.equal(weights["layers.1.k_norm"], attention.key_layernorm.weight)
    rotary = prepared.reference.model.rotary_emb
    assert rotary.rope_type == "ntk_alpha" and torch.equal(weights["rope.inv_freq"], rotary.inv_freq)


def test_a_drafts_history_write_norms_the_rotated_keys(prepared):
    """A draft's history writes (`draft.write_keys`: the last layer only projects, rotates, norms and
    writes its keys) cache the keys the decoder caches."""
    from helios.ignition.decoder import PackedStep, decoder_hidden, slot_mapping
    from helios.ignition.draft import DraftStorage, write_keys

    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    positions, page_tokens = torch.arange(7), 4
    query_start, table = torch.tensor([0, 7], dtype=torch.int32), torch.tensor([[1, 0]], dtype=torch.int32)
    step = PackedStep(torch.tensor(equivalence.random_prompt(7, seed=5)), positions, query_start, table,
                      slot_mapping(query_start, table, positions, page_tokens))
    shape = (arch.num_layers, 2, page_tokens, arch.num_kv_heads, arch.head_dim)
    decoded, drafted = [torch.zeros(shape) for _ in range(2)], [torch.zeros(shape) for _ in range(2)]
    decoder_hidden(arch, weights, *decoded, step)
    write_keys(arch, weights, DraftStorage(*drafted, table), step)
    assert drafted[0][-1].abs().sum() > 0
    torch.testing.assert_close(drafted, decoded, rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------------
# config.json: the released spelling, refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(HUNYUAN, seed=2), tmp_path_factory.mktemp("hunyuan"))


def test_the_released_rope_spelling_prepares_the_same_model(checkpoint, tmp_path):
    """Hunyuan-7B's config.json: rope_scaling with ``type`` "dynamic", an alpha and YaRN-looking keys
    the reference does not read for it, rope_theta at the top level."""
    def released(config):
        rope = config.pop("rope_parameters")
        config.update(rope_theta=rope["rope_theta"], rope_scaling={
            "type": "dynamic", "alpha": rope["alpha"], "factor": 1.0, "beta_fast": 32, "beta_slow": 1,
            "mscale": 1.0, "mscale_all_dim": 1.0})

    current = load_checkpoint(checkpoint)
    legacy = load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, released))
    assert legacy.architecture == current.architecture
    assert all(torch.equal(a.tensor, b.tensor) for a, b in zip(legacy.weights, current.weights))


def _rope(**changes):
    return lambda config: config["rope_parameters"].update(changes)


REFUSED = {
    "dynamic rope without an alpha": (_rope(alpha=None), "rope_type"),
    "a negative alpha": (_rope(alpha=-2.0), "alpha"),
    "a string alpha": (_rope(alpha="50"), "alpha"),
    "no head_dim": (lambda config: config.pop("head_dim"), "head_dim"),
    "partial rotary": (_rope(partial_rotary_factor=0.5), "partial_rotary_factor"),
    "gelu": (lambda config: config.update(hidden_act="gelu"), "hidden_act"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_settings_the_recipe_does_not_implement_are_refused_by_name(checkpoint, tmp_path, case):
    assert_refused(checkpoint, tmp_path, *REFUSED[case])


def test_the_released_rope_gets_the_references_frequencies():
    """Hunyuan-7B's rope (head_dim 128, theta 10000, alpha 1000; no weights): the reference's NTK-alpha
    inverse frequencies, bit for bit."""
    from transformers.models.hunyuan_v1_dense.modeling_hunyuan_v1_dense import HunYuanDenseV1RotaryEmbedding

    from helios.ignition.recipes.hunyuan import with_static_rope
    from helios.ignition.recipes.llama import rope_inv_freq

    rope = {"type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
            "mscale_all_dim": 1.0}
    config = dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128, rope_theta=10000.0,
                  rope_scaling=rope, max_position_embeddings=262144)
    reference = HunYuanDenseV1RotaryEmbedding(transformers.HunYuanDenseV1Config(**config))
    assert reference.rope_type == "ntk_alpha"
    assert torch.equal(rope_inv_freq(with_static_rope(config), 128), reference.inv_freq)
