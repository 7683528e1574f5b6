"""The Mamba2 hybrid families after Bamba served by the generic runtime (tests/runtime/test_hybrid_runtime.py's
plan and helpers): a continuous batch of prompts gives transformers' float32 greedy tokens, and a
prompt extending an earlier one restores that one's snapshot (state rows and partial page) with the
same tokens as the reference.

Falcon-H1 runs in the suite: each layer holds attention pages and mixer state rows at once
(`Architecture.parallel_mixer`). HELIOS_HYBRID_SERVED_ALL=1 adds Granite 4.0's dense shape
(attention without positions) and both Nemotron-H shapes (layers without an MLP; relu2 experts).
"""

from __future__ import annotations

import pytest
import transformers

from helios.runtime.offline import generate
from ignition.hf_checkpoints import FALCON_H1, GRANITE_HYBRID_DENSE, NEMOTRON_H, NEMOTRON_H_MOE
from support.bamba_reference import grouped_gated_norm
from support.sweeps import swept

from .test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, prepare_signed, reference_tokens, runtime_of

FAMILIES = [FALCON_H1] + ([GRANITE_HYBRID_DENSE, NEMOTRON_H, NEMOTRON_H_MOE]
                          if swept("HELIOS_HYBRID_SERVED_ALL") else [])  # Falcon-H1 takes the path by default


@pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
def served(request, tmp_path_factory):
    """(core directory, transformers reference) of the family's signed core."""
    root = tmp_path_factory.mktemp(request.param.name)
    checkpoint = prepare_signed(request.param, root, NAMESPACE, prefill_chunks=())  # prompt programs of 32 tokens
    reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()
    grouped_gated_norm(reference)
    reference.generation_config.eos_token_id = None
    return root, reference


def test_a_batch_and_a_restored_snapshot_give_the_reference_tokens(served):
    expected = [reference_tokens(served, prompt) for prompt in PROMPTS]
    batched = runtime_of(served)
    assert [list(result.token_ids) for result in generate(batched.engine, PROMPTS, STEPS)] == expected
    runtime = runtime_of(served)
    generate(runtime.engine, [PROMPTS[0]], STEPS)  # publishes a snapshot at its prompt boundary
    assert list(generate(runtime.engine, [PROMPTS[1]], STEPS)[0].token_ids) == expected[1]
    counters = runtime.engine.scheduler.counters()
    assert counters.snapshots_restored == 1 and counters.prefix_reused_tokens >= len(PROMPTS[0])
