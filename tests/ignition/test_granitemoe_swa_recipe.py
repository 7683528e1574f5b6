"""The Granite SWA recipe's mixture-of-experts side against transformers' GraniteMoeSWAForCausalLM on a tiny random
float32 checkpoint (tests/ignition/hf_checkpoints.py GRANITE_MOE_SWA): Granite MoE Shared's experts (4, top-2
softmax) and shared expert beside learned sinks, sliding and full layers over a window of 5 with one rope base, and
Granite's multipliers. Prefill logits, scored log-probabilities and greedy tokens (single, batched, from cached prefix
pages) equal the reference's (test_equivalence's checks and tolerances); the layout is the reference's weights with
the residual multiplier folded in.
"""

from __future__ import annotations

import pytest
import torch

from helios.ignition.architecture import MixtureOfExperts, weight_layout

from . import test_equivalence as equivalence
from .hf_checkpoints import GRANITE_MOE_SWA


@pytest.fixture(scope="module")
def prepared(prepare):
    return prepare(GRANITE_MOE_SWA)


class TestAgainstTransformers(equivalence.FamilyChecks):
    """test_equivalence's four checks on this module's `prepared` family."""


def test_the_architecture_and_weights_come_from_the_config(prepared):
    arch, weights = prepared.recipe.architecture, dict(prepared.recipe.weights)
    assert list(weights) == [slot.name for slot in weight_layout(arch)]
    assert arch.moe == MixtureOfExperts(4, 2, 32, (0, 1), scoring="topk_softmax", shared_intermediate_size=48)
    assert arch.attention_sinks and arch.layer_windows == (5, 0) and arch.nope_layers == arch.local_rope_layers == ()
    layer = prepared.reference.model.layers[1]
    assert torch.equal(weights["layers.1.sinks"], layer.self_attn.sinks)
    assert torch.allclose(weights["layers.1.shared.down.weight"], 0.5 * layer.shared_mlp.output_linear.weight)
