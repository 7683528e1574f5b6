"""Youtu-LLM (YoutuForCausalLM) against transformers on a tiny random float32 checkpoint.

Its dataflow is DeepSeek-V3's latent attention (the deepseek recipe: the low-rank query pair, YaRN
with DeepSeek's mscale, interleaved rotary rows de-interleaved at preparation) with the gated MLP in
every layer and tied embeddings. Prefill logits, scored log-probabilities and greedy tokens (single,
batched, from cached prefix pages) equal the reference's (test_equivalence's checks and tolerances);
unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest

from helios.ignition.architecture import weight_layout
from helios.ignition.recipes import UnsupportedCheckpoint, load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import YOUTU, rewritten_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(YOUTU)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_every_layer_is_dense_and_the_embeddings_tied(prepared):
    arch = prepared.recipe.architecture
    assert arch.moe is None and arch.tie_word_embeddings and arch.latent.q_lora_rank == 24
    assert arch.latent.rope_attention_factor == pytest.approx(prepared.reference.model.rotary_emb.attention_scaling)
    names = [slot.name for slot in weight_layout(arch)]
    assert list(dict(prepared.recipe.weights)) == names and "lm_head" not in names


@pytest.mark.parametrize("change,message", [
    ({"num_key_value_heads": 2}, "num_key_value_heads"),
    ({"attention_bias": True}, "attention_bias"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}}, "rope_type"),
])
def test_unsupported_configs_are_refused_by_name(prepared, tmp_path, change, message):
    checkpoint = write_checkpoint(prepared.reference, tmp_path / "youtu")
    with pytest.raises(UnsupportedCheckpoint, match=message):
        load_checkpoint(rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(change)))
