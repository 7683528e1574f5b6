"""The hybrids with new state kinds served by the generic runtime (tests/runtime/test_hybrid_runtime.py's plan and
helpers): a batch preempted with its state rows offloaded to host slots and restored gives transformers' float32
greedy tokens, and a prompt extending an earlier one restores that one's snapshot (state rows and partial page)
with the reference's tokens.

Only with HELIOS_HYBRID_SERVED_ALL=1 (about 13 s each, beyond the suite's budget for these families; the recipe
tests cover a prompt's state carried across chunks and decode steps): Kimi Linear (Kimi Delta Attention state rows,
a decay per key channel, beside latent attention pages), LFM2 (its whole state the short convolutions' windows, the
``ssm_state`` rows one-element placeholders) and OLMo Hybrid (Gated DeltaNet state rows beside OLMo 2's attention
blocks)."""

from __future__ import annotations

import pytest
import transformers

from helios.runtime.offline import generate
from helios.runtime.records.plan import StorageKind
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from ignition.hf_checkpoints import KIMI_LINEAR, LFM2, OLMO_HYBRID
from support.sweeps import swept

from .test_hybrid_runtime import NAMESPACE, PROMPTS, STEPS, prepare_signed, reference_tokens, runtime_of


FAMILIES = [KIMI_LINEAR, LFM2, OLMO_HYBRID]


# Defined only with the variable set: the suite collects nothing here (no skipped parameter set).
if swept("HELIOS_HYBRID_SERVED_ALL"):  # by default: test_hybrid_runtime (Bamba), test_hybrid_families_served
    @pytest.fixture(scope="module", params=FAMILIES, ids=lambda family: family.name)
    def served(request, tmp_path_factory):
        """(core directory, transformers reference) of the family's signed core."""
        root = tmp_path_factory.mktemp(request.param.name)
        checkpoint = prepare_signed(request.param, root, NAMESPACE)
        reference = transformers.AutoModelForCausalLM.from_pretrained(checkpoint).float().eval()
        reference.generation_config.eos_token_id = None
        return root, reference, [reference_tokens((root, reference), prompt) for prompt in PROMPTS]


    def test_a_preempted_batch_and_a_restored_snapshot_give_the_reference_tokens(served):
        """A batch preempted with its state rows offloaded to host slots and restored; then (enough pages to keep
        snapshots) a prompt extending an earlier one restores that one's snapshot."""
        root, reference, expected = served
        runtime = runtime_of((root, reference), num_pages=17, host_pages=32,
                             policy=SchedulerPolicy(preemption=PreemptionMode.OFFLOAD))
        results = generate(runtime.engine, PROMPTS, STEPS)
        counters = runtime.engine.scheduler.counters()
        assert counters.preemptions > 0 and counters.snapshots_published > 0
        assert [list(r.token_ids) for r in results] == expected
        _, host_state = runtime.engine.executor.storage.planes(StorageKind.HOST)
        assert any(p.tensor.abs().sum() > 0 for p in host_state)  # the state rows went to host slots and back
        runtime.engine.scheduler.check_invariants()
        warm = runtime_of((root, reference))
        generate(warm.engine, [PROMPTS[0]], STEPS)  # publishes a snapshot at its prompt boundary
        assert list(generate(warm.engine, [PROMPTS[1]], STEPS)[0].token_ids) == expected[1]
        counters = warm.engine.scheduler.counters()
        assert counters.snapshots_restored == 1 and counters.prefix_reused_tokens >= len(PROMPTS[0])
