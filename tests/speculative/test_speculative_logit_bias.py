"""Logit bias under speculative decoding: SPECULATIVE programs take the plain programs' logit-bias
inputs and add a lane's bias to the draft's and the target's logits at every position.

Each case runs the same requests through an engine with and without speculation over the same
eager programs (`runtime.stress.stress_model`) of a tiny Llama 2 checkpoint and asserts the tokens
(and where asked, the log-probabilities) equal and that speculative rounds ran, the biased lanes'
included (they used to turn every step of the cohort into a plain one):

- greedy lanes with the target's first layer as the draft (rounds accept and reject): a bias that
  nudges, one that forces a token, -100 bans of what the lane would emit unbiased, each beside an
  unbiased lane;
- seeded sampling with the target as the draft (the same draws as plain decoding), with penalties
  too (the bias is added before them, as plain sampling adds it);
- a grammar-constrained lane whose bias favours tokens its grammar bans half the time (the mask
  still wins);
- top_logprobs: the token-logprobs twins score the biased distribution, as plain programs do.

A core prepared before SPECULATIVE programs took the bias inputs (their graphs bind none) keeps a
lane with a bias on plain steps.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from helios.contract import PreparedContract
from helios.contract import manifest_pb2 as mpb
from helios.contract import serving_pb2 as spb
from helios.ignition.recipes import load_checkpoint
from helios.runtime.execution.geometry import capacities_for
from helios.runtime.loading.model import LoadedModel
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA2, random_model, write_checkpoint
from runtime.stress import capacity_plan, stress_model

from .support import eager_runtime, truncated
from .test_speculative_logprobs_paths import close, run_to_length

PROMPTS = [(5, 9, 17, 3, 44, 2, 8), (1, 2, 3)]
MAX_TOKENS = 12
SAMPLED = SamplingParams(temperature=0.9, top_k=20, seed=1234)
PENALIZED = SamplingParams(temperature=0.9, presence_penalty=0.7, frequency_penalty=0.5, repetition_penalty=1.3,
                           seed=7)
BIAS_SOURCES = (spb.VALUE_SOURCE_LOGIT_BIAS_IDS, spb.VALUE_SOURCE_LOGIT_BIAS_VALUES)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA2), tmp_path_factory.mktemp("llama2")))


def model_of(recipe, draft: str = "layer") -> LoadedModel:
    return stress_model(recipe, recipe if draft == "target" else truncated(recipe, 1), capacity_plan(4))


def run(model: LoadedModel, specs, speculative: bool, grammars=()):
    """(tokens by request, logprobs by request, Counting) of `specs` submitted at once."""
    engine, counting = eager_runtime(model, SchedulerPolicy(speculative=speculative))
    events = run_to_length(engine, specs, grammars)
    tokens = {r: [t for e in evs if isinstance(e, TokenEvent) for t in e.token_ids] for r, evs in events.items()}
    logprobs = {r: [lp for e in evs if isinstance(e, TokenEvent) for lp in e.logprobs or ()]
                for r, evs in events.items()}
    return tokens, logprobs, counting


def assert_speculation_equals_plain(model: LoadedModel, specs, grammars=()):
    """The tokens (and logprobs) of `specs` with and without speculation are equal, and every lane
    (the biased ones too) took tokens from speculative rounds; returns the tokens and logprobs."""
    plain_tokens, plain_logprobs, plain = run(model, specs, False, grammars)
    tokens, logprobs, counting = run(model, specs, True, grammars)
    assert plain.rounds == 0 and counting.rounds > 0 and counting.emitted > counting.lanes
    assert all(counting.speculated[spec.request_id] > 0 for spec in specs)
    assert tokens == plain_tokens
    for spec in specs:
        for mine, theirs in zip(logprobs[spec.request_id], plain_logprobs[spec.request_id], strict=True):
            assert close(mine.logprob, theirs.logprob), (spec.request_id, mine, theirs)
            assert [i for i, _ in mine.top] == [i for i, _ in theirs.top]
            assert all(close(a, b) for (_, a), (_, b) in zip(mine.top, theirs.top))
    return tokens, logprobs


def test_greedy_biased_lanes_speculate_beside_free_ones(recipe):
    model = model_of(recipe)
    free, _, _ = run(model, [RequestSpec(f"f{i}", p, MAX_TOKENS) for i, p in enumerate(PROMPTS)], False)
    banned = tuple((token, -100.0) for token in sorted(set(free["f0"])))  # everything it chose unbiased
    specs = [RequestSpec("nudged", PROMPTS[0], MAX_TOKENS, logit_bias=((7, 3.0), (11, -100.0))),
             RequestSpec("forced", PROMPTS[1], MAX_TOKENS, logit_bias=((42, 100.0),)),
             RequestSpec("banned", PROMPTS[0], MAX_TOKENS, logit_bias=banned),
             RequestSpec("free", PROMPTS[1], MAX_TOKENS)]
    tokens, _ = assert_speculation_equals_plain(model, specs)
    assert tokens["forced"] == [42] * MAX_TOKENS
    assert not set(tokens["banned"]) & set(free["f0"])
    assert tokens["free"] == free["f1"]


@pytest.mark.parametrize("sampling", [SAMPLED, PENALIZED], ids=["sampled", "penalized"])
def test_seeded_biased_lanes_draw_what_plain_decoding_draws(recipe, sampling):
    specs = [RequestSpec("biased", PROMPTS[0], MAX_TOKENS, sampling=sampling,
                         logit_bias=((7, 4.0), (11, -100.0), (42, 2.5))),
             RequestSpec("free", PROMPTS[1], MAX_TOKENS, sampling=sampling)]
    tokens, _ = assert_speculation_equals_plain(model_of(recipe, "target"), specs)
    assert 11 not in tokens["biased"]


def test_a_grammar_mask_still_bans_what_the_bias_favours(recipe):
    """Odd ids are banned at the constrained lane's even tokens: a +100 bias on 7 cannot pass the
    mask there (plain sampling masks the biased logits) and wins at every odd token."""
    specs = [RequestSpec("g", PROMPTS[0], MAX_TOKENS, constrained=True, logit_bias=((7, 100.0),)),
             RequestSpec("b", PROMPTS[1], MAX_TOKENS, logit_bias=((8, 1.5),))]
    tokens, _ = assert_speculation_equals_plain(model_of(recipe), specs, grammars=("g",))
    assert tokens["g"][1::2] == [7] * (MAX_TOKENS // 2) and 7 not in tokens["g"][0::2]


def test_logprobs_of_biased_lanes_are_those_of_the_biased_distribution(recipe):
    specs = [RequestSpec("biased", PROMPTS[0], MAX_TOKENS, top_logprobs=3, logit_bias=((7, 3.0), (42, 100.0))),
             RequestSpec("free", PROMPTS[1], MAX_TOKENS, top_logprobs=3)]
    _, logprobs = assert_speculation_equals_plain(model_of(recipe), specs)
    assert all(lp.top[0][0] == 42 and math.isclose(lp.logprob, 0.0, abs_tol=1e-4) for lp in logprobs["biased"])


def older_core(model: LoadedModel) -> LoadedModel:
    """`model` as a core prepared before SPECULATIVE programs took the logit-bias inputs: their
    graphs bind none and their programs take none (each calls the new program with no bias)."""
    contract, manifest = spb.ServingContract(), mpb.ExecutionManifest()
    contract.CopyFrom(model.prepared.contract)
    manifest.CopyFrom(model.prepared.manifest)
    speculative = {g.name for g in contract.model.graphs if g.operation == spb.GRAPH_OPERATION_SPECULATIVE}
    names = set()
    for graph in contract.model.graphs:
        if graph.name in speculative:
            names |= {b.destination for b in graph.bindings if b.source in BIAS_SOURCES}
            kept = [b for b in graph.bindings if b.source not in BIAS_SOURCES]
            del graph.bindings[:]
            graph.bindings.extend(kept)
    for handle in manifest.graph_handles:
        if handle.graph in speculative:
            kept = [name for name in handle.program_inputs if name not in names]
            del handle.program_inputs[:]
            handle.program_inputs.extend(kept)
    rows = model.num_state_rows
    programs = tuple(_unbiased(p, names, rows) if p.graph in speculative else p for p in model.programs)
    return dataclasses.replace(model, prepared=PreparedContract.from_messages(contract, manifest), programs=programs)


class _NoBias(torch.nn.Module):
    """A program called without its logit-bias inputs: it gets ids -1 and values 0 (no bias)."""

    def __init__(self, module, where: tuple[int, int], rows: int):
        super().__init__()
        self.module, self.where = module, where
        self.padding = (torch.full((rows, 1), -1, dtype=torch.int64), torch.zeros((rows, 1)))

    def forward(self, weights, *inputs):
        inputs = list(inputs)
        for index, value in sorted(zip(self.where, self.padding)):
            inputs.insert(index, value)
        return self.module(weights, *inputs)


def _unbiased(program, names: set[str], rows: int):
    where = tuple(i for i, name in enumerate(program.inputs) if name in names)
    kept = [i for i in range(len(program.inputs)) if i not in where]
    return dataclasses.replace(program, module=_NoBias(program.module, where, rows),
                               inputs=tuple(program.inputs[i] for i in kept),
                               input_shapes=tuple(program.input_shapes[i] for i in kept))


def test_an_older_core_keeps_biased_lanes_plain(recipe):
    model = older_core(model_of(recipe))
    assert not capacities_for(model, 16).speculative_logit_bias
    assert capacities_for(model_of(recipe), 16).speculative_logit_bias
    biased = [RequestSpec("biased", PROMPTS[0], MAX_TOKENS, logit_bias=((7, 3.0),))]
    _, _, counting = run(model, biased, True)
    assert counting.rounds == 0 and counting.operations["DECODE"] > 0
    _, _, counting = run(model, [RequestSpec("free", PROMPTS[0], MAX_TOKENS)], True)
    assert counting.rounds > 0  # it still speculates without a bias
