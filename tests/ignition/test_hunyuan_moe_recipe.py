"""The Hunyuan MoE recipe against transformers' HunYuanMoEV1ForCausalLM on a tiny random float32 checkpoint.

The shape (tests/ignition/hf_checkpoints.py HUNYUAN_MOE): Hunyuan dense's attention (q/k norms after
the rotation, NTK-alpha rope, q/k/v/o biases) with a mixture in every layer: a float32 router over 6
experts, top-2 renormalised, and a shared expert always added. Prefill logits, scored log-probabilities
and greedy tokens (single, batched, from cached prefix pages) equal the reference's (test_equivalence's
checks and tolerances); a served core does too; the prepared layout is the mixture's with the shared
expert; per-layer moe_topk lists of one value are that value; unsupported settings are refused by name.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import CheckpointError, MixtureOfExperts, weight_layout
from helios.ignition.recipes import load_checkpoint

from . import test_equivalence as equivalence
from .hf_checkpoints import HUNYUAN_MOE, assert_refused, random_model, rewritten_checkpoint, write_checkpoint
from .test_llama_shaped_served import check_served_core


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(HUNYUAN_MOE)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_prepared_layout_is_the_mixture_with_its_shared_expert(prepared):
    weights, arch = dict(prepared.recipe.weights), prepared.recipe.architecture
    layer = prepared.reference.model.layers[1]
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(6, 2, 32, (0, 1), normalize=True, shared_intermediate_size=32)
    assert arch.intermediate_size == 0 and arch.qk_norm_after_rotary and arch.qkv_bias and arch.o_bias
    assert torch.equal(weights["layers.1.router.weight"], layer.mlp.gate.wg.weight)
    assert torch.equal(weights["layers.1.experts.gate_up"], layer.mlp.experts.gate_up_proj)
    shared = layer.mlp.shared_mlp
    assert torch.equal(weights["layers.1.shared.gate_up.weight"], torch.cat([shared.gate_proj.weight,
                                                                            shared.up_proj.weight]))
    assert torch.equal(weights["layers.1.q_norm"], layer.self_attn.query_layernorm.weight)


def test_a_served_core_gives_the_reference_tokens_and_logits(tmp_path):
    check_served_core(tmp_path, HUNYUAN_MOE)


# ---------------------------------------------------------------------------------------------------
# config.json spellings and refusals.


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(random_model(HUNYUAN_MOE, seed=4), tmp_path_factory.mktemp("hunyuan-moe-checkpoint"))


def test_a_per_layer_topk_list_of_one_value_is_that_value(checkpoint, tmp_path):
    directory = rewritten_checkpoint(checkpoint, tmp_path, lambda config: config.update(moe_topk=[2, 2]))
    assert load_checkpoint(directory).architecture.moe.experts_per_token == 2


REFUSED = {
    "per-layer top-k": (dict(moe_topk=[2, 3]), "moe_topk"),
    "a top-k list of another length": (dict(moe_topk=[2]), "moe_topk"),
    "per-layer expert counts": (dict(num_experts=[6, 6]), "num_experts"),
    "no head_dim": (dict(head_dim=None), "head_dim"),
    "another activation": (dict(hidden_act="gelu"), "hidden_act"),
    "too many experts per token": (dict(moe_topk=7), "7 experts per token of 6"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_hunyuan_moe_settings_are_refused_by_name(checkpoint, tmp_path, case):
    changes, setting = REFUSED[case]
    assert_refused(checkpoint, tmp_path, lambda config: config.update(changes), setting, error=CheckpointError)
