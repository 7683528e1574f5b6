"""Token log-probabilities of penalised and biased requests that are preempted, against `transformers`.

README (`logprobs`, `logit_bias`) documents each value as the distribution the token was drawn from:
the logits plus the request's bias, then the repetition, frequency and presence penalties
(`helios.abi.sampling.apply_penalties`), before temperature. Requests that combine both, greedy and
sampled, run on an engine whose page pool preempts them (recomputed, or offloaded to host slots and
restored): every token's value and alternatives must equal float64 ``log_softmax`` of `transformers`'
float32 logits for the same prefix with the bias and penalties applied, the greedy token its argmax.
A recomputed prefill that counted earlier output tokens as prompt tokens (or lost the bias of the
request's new slot) would move them. So would a prompt histogram that held only the tokens a request
computed: choices admitted onto a shared prompt's pages compute its last token alone, and a request
over a cached prefix its uncached rest.
"""

from __future__ import annotations

import random

import pytest
import torch

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams
from helios.runtime.scheduling.policy import PreemptionMode, SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint
from runtime.stress import capacity_plan, stress_engine, stress_model

TOLERANCE = 1e-4
NUM_PAGES = 18  # 4-token pages, 64-token context: one request takes 16, so four of them preempt each other
GREEDY = SamplingParams(repetition_penalty=1.3, presence_penalty=0.7, frequency_penalty=0.4)
SAMPLED = SamplingParams(temperature=0.9, repetition_penalty=1.2, frequency_penalty=0.5, seed=11)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = random_model(LLAMA3_UNTIED)
    directory = write_checkpoint(model, tmp_path_factory.mktemp("logprobs-s68"))
    return load_checkpoint(directory), model.float().eval()


def _requests(vocab: int) -> list[RequestSpec]:
    rng = random.Random(3)
    specs = []
    for index in range(4):
        prompt = tuple(rng.randrange(1, vocab) for _ in range(rng.randrange(5, 20)))
        bias = tuple((token, float(rng.choice((-100, -3, 2, 5)))) for token in rng.sample(range(vocab), 20))
        specs.append(RequestSpec(f"r{index}", prompt, 24, top_logprobs=5, sampling=(GREEDY, SAMPLED)[index % 2],
                                 logit_bias=bias))
    return specs


def _recorder(specs: list[RequestSpec]):
    """(tokens, logprobs) by request id, filled by the returned event callback."""
    tokens = {spec.request_id: [] for spec in specs}
    logprobs = {spec.request_id: [] for spec in specs}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)
            logprobs[event.request_id].extend(event.logprobs or ())

    return (tokens, logprobs), record


def _check(model, specs: list[RequestSpec], tokens: dict, logprobs: dict) -> None:
    for spec in specs:
        name, output = spec.request_id, tokens[spec.request_id]
        assert len(output) == spec.max_output_tokens and len(logprobs[name]) == len(output), name
        table = _reference(model, spec, output)
        for position, (token, entry, row) in enumerate(zip(output, logprobs[name], table)):
            assert abs(entry.logprob - row[token].item()) < TOLERANCE, (name, position)
            if spec.sampling.is_greedy:
                assert token == int(row.argmax()), (name, position)
            expected = torch.topk(row, len(entry.top))
            assert [i for i, _ in entry.top] == expected.indices.tolist(), (name, position)
            assert max(abs(v - e) for (_, v), e in zip(entry.top, expected.values.tolist())) < TOLERANCE


def _reference(model, spec: RequestSpec, tokens: list[int]) -> torch.Tensor:
    """float64 log-probabilities [len(tokens), V] of each output position: the logits plus the
    bias, then the penalties over the prompt and the outputs before it."""
    ids = torch.tensor([list(spec.prompt_ids) + tokens[:-1]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(spec.prompt_ids) - 1:].double()
    for token, value in spec.logit_bias:
        logits[:, token] += value
    sampling, vocab = spec.sampling, logits.shape[1]
    rows = []
    for position, row in enumerate(logits):
        counts = torch.bincount(torch.tensor(tokens[:position], dtype=torch.int64), minlength=vocab).double()
        seen = counts > 0
        seen[list(spec.prompt_ids)] = True
        r = sampling.repetition_penalty
        row = torch.where(seen, torch.where(row > 0, row / r, row * r), row)
        row = torch.where(counts > 0, row - sampling.frequency_penalty * counts - sampling.presence_penalty, row)
        rows.append(torch.log_softmax(row, dim=-1))
    return torch.stack(rows)


@pytest.mark.parametrize(("mode", "host_pages"), [(PreemptionMode.RECOMPUTE, 0), (PreemptionMode.OFFLOAD, 24)])
def test_preempted_penalised_and_biased_requests_report_transformers_logprobs(checkpoint, mode, host_pages):
    recipe, model = checkpoint
    specs = _requests(recipe.architecture.vocab_size)
    engine = stress_engine(stress_model(recipe, None, capacity_plan(None), num_pages=NUM_PAGES),
                           SchedulerPolicy(speculative=False, preemption=mode), host_pages=host_pages)
    (tokens, logprobs), record = _recorder(specs)
    for spec in specs:
        engine.submit(EngineRequest(spec, record))
    engine.run_until_idle()
    assert engine.scheduler.counters().preemptions > 0
    _check(model, specs, tokens, logprobs)


def test_penalised_requests_over_shared_and_cached_prompts_report_transformers_logprobs(checkpoint):
    """Three choices of one prompt (greedy and sampled) share its pages; then a request extending it
    reuses its cached pages. Each one's histogram holds its whole prompt."""
    recipe, model = checkpoint
    engine = stress_engine(stress_model(recipe, None, capacity_plan(None)), SchedulerPolicy(speculative=False))
    rng = random.Random(5)
    prompt = tuple(rng.randrange(1, recipe.architecture.vocab_size) for _ in range(30))
    choices = [RequestSpec(f"c{j}", prompt, 8, top_logprobs=3, sampling=(GREEDY, SAMPLED)[min(j, 1)].with_seed(j))
               for j in range(3)]
    extension = RequestSpec("x", prompt + (7, 8, 9), 8, top_logprobs=3, sampling=GREEDY)
    (tokens, logprobs), record = _recorder(choices + [extension])
    for spec in choices:
        engine.submit(EngineRequest(spec, record))
    engine.run_until_idle()
    assert engine.scheduler.cache.groups.num_shared_admissions > 0
    engine.submit(EngineRequest(extension, record))
    engine.run_until_idle()
    assert engine.scheduler.counters().prefix_reused_tokens >= len(prompt) - len(prompt) % 4
    _check(model, choices + [extension], tokens, logprobs)
