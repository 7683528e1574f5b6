"""Declared non-sampled ids (``vocabulary.excluded_ids``, e.g. a vision core's image sentinel inside
the sampled range) under speculative decoding. Every packed mask row clears them
(`helios.runtime.execution.masks`) and plain programs apply every row's mask, so plain sampling
never returns one; a SPECULATIVE round applied its lanes' mask rows at position 0 only, so a lane
whose logit bias favours an excluded id emitted it from the second verified position on (and
log-probabilities there were normalised over the excluded ids too).

The same requests run through an engine with and without speculation over the same eager programs
(test_speculative_logit_bias's tiny Llama 2, its first layer the draft), on that core's contract
with two sampled ids declared excluded: the tokens and log-probabilities must be equal and the
lanes must take tokens from speculative rounds.
"""

from __future__ import annotations

import dataclasses

import pytest

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.runtime.loading.model import LoadedModel
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams

from .test_speculative_logit_bias import MAX_TOKENS, PROMPTS, assert_speculation_equals_plain, model_of
from .test_speculative_logit_bias import recipe  # noqa: F401  (the module's checkpoint fixture)

EXCLUDED = (42, 7)


def excluding(model: LoadedModel) -> LoadedModel:
    """`model` with `EXCLUDED` declared non-sampled ids of its vocabulary (as a vision core
    declares its image sentinel)."""
    contract, manifest = spb.ServingContract(), mpb.ExecutionManifest()
    contract.CopyFrom(model.prepared.contract)
    manifest.CopyFrom(model.prepared.manifest)
    contract.model.vocabulary.excluded_ids.extend(EXCLUDED)
    return dataclasses.replace(model, prepared=PreparedContract.from_messages(contract, manifest))


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.9, top_k=20, seed=3)],
                         ids=["greedy", "sampled"])
def test_no_round_emits_an_excluded_id_its_bias_forces(recipe, sampling):  # noqa: F811
    # the target as its own draft: sampled rounds draw plain decoding's tokens (test_distribution)
    model = excluding(model_of(recipe, "layer" if sampling.is_greedy else "target"))
    specs = [RequestSpec("forced", PROMPTS[0], MAX_TOKENS, sampling=sampling, logit_bias=((42, 100.0), (7, 50.0)))]
    tokens, _ = assert_speculation_equals_plain(model, specs)
    assert not set(tokens["forced"]) & set(EXCLUDED)


def test_log_probabilities_leave_the_excluded_ids_out_at_every_position(recipe):  # noqa: F811
    specs = [RequestSpec("scored", PROMPTS[1], MAX_TOKENS, top_logprobs=3)]
    assert_speculation_equals_plain(excluding(model_of(recipe)), specs)
