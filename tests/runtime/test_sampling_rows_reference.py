"""Per-request sampling parameters reach ``helios::sample`` for every row of a mixed batch, and the
packed parameter row keeps each request's meaning (tests/abi/test_sampling_reference.py compares the
op itself with transformers' logits processors).

The served checks run the tiny core (`support.server_core.tiny_core`) on the CPU with the sampler's
uniform fixed at its largest value (1 - 2**-53), so every drawing row returns the last token its
filters keep: top-k's k-th token, top-p's last nucleus token, min-p's last token above its
threshold, each a different rank of the row's distribution. The rows' expected tokens come from
transformers' warpers applied to the distribution the engine reports for the request (its
``top_logprobs`` 20, a distribution after penalties and bias, before temperature and filters; the
mass outside them spread over tokens less probable than the 20th), and each row's parameters are
chosen from that distribution so that its last kept token is a different rank inside the 20.
Penalties through the runtime: a penalised request's tokens do not depend on whether its prompt was
computed, cached or shared, and presence/frequency lower exactly each row's own generated tokens in
the reported distribution (OpenAI's definition).
"""

from __future__ import annotations

import asyncio
import math

import httpx
import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (
    MinPLogitsWarper, RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from helios.abi import sampling
from helios.abi.grammar import mask_words
from helios.core.reader import open_core
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import TOP_K_OFF, SamplingParams
from helios.runtime.service import build_runtime
from helios.server.app import create_app
from support.server_core import SERVED_ID, served_tiny_core, tiny_core

LAST_UNIFORM = 1.0 - 2.0**-53
PROMPT = (40, 41, 42, 7)
TOP = 20


# ---------------------------------------------------------------- the packed row


@pytest.mark.parametrize("top_k", [10**400, 2**63, TOP_K_OFF, -(10**400)])
def test_a_top_k_of_any_size_beyond_every_vocabulary_is_off(top_k):
    """A client's top_k may be any integer (the API bounds it below only): one at least every
    vocabulary turns the filter off, as 0 does, and packs as 0 (float() of 10**400 overflowed)."""
    params = SamplingParams(temperature=1.0, top_k=top_k, seed=5)
    assert params == SamplingParams(temperature=1.0, top_k=0, seed=5)
    assert params.packed()[1] == 0.0
    assert SamplingParams(top_k=TOP_K_OFF - 1).packed()[1] == float(TOP_K_OFF - 1)


def op_tokens(params: SamplingParams, logits, prompt_counts) -> list[int]:
    """``helios::sample`` of `logits` [R, V] with `params`' packed row as the programs write it (float32)."""
    logits = torch.as_tensor(logits, dtype=torch.float32)
    rows, vocab = logits.shape
    packed = torch.tensor([params.packed()] * rows, dtype=torch.float32)
    temperature, top_k, top_p, min_p, penalties = sampling.split_sampling_parameters(packed)
    counts = torch.as_tensor(prompt_counts, dtype=torch.int32).expand(rows, vocab).contiguous()
    return torch.ops.helios.sample(
        logits, torch.full((rows,), params.seed, dtype=torch.int64), torch.arange(rows, dtype=torch.int64),
        temperature, top_k, top_p, min_p, penalties, counts, torch.zeros_like(counts),
        torch.full((rows, mask_words(vocab)), -1, dtype=torch.int32), torch.zeros(rows, dtype=torch.bool)).tolist()


def test_a_tiny_repetition_penalty_scales_seen_logits_instead_of_dividing_by_zero():
    """The API accepts any repetition penalty above 0; 1e-50 rounded to float32 0 made every seen
    positive logit x / 0 = inf, a tie won by the lowest id. Transformers' processor (float64)
    scales them by 1e50 and the argmax stays the largest seen logit."""
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    seen = torch.tensor([[1, 1, 1, 0]])
    expected = RepetitionPenaltyLogitsProcessor(1e-50)(torch.tensor([[0, 1, 2]]), logits.double())
    assert int(expected.argmax()) == 1
    assert op_tokens(SamplingParams(repetition_penalty=1e-50), logits, seen) == [1]
    drawn = op_tokens(SamplingParams(temperature=1.0, repetition_penalty=1e-50, seed=3), logits.repeat(64, 1), seen)
    assert set(drawn) == {1}  # 2e50 above the next logit: every draw takes it


def test_a_huge_repetition_penalty_keeps_a_seen_zero_logit():
    """A core's or operator's default repetition penalty may be any finite value above 0; 1e39
    rounded to float32 inf made a seen zero logit 0 * inf = NaN, banned. Transformers' processor
    keeps it at 0 (0 / 1e39), where it is the largest of these logits."""
    logits = torch.tensor([[0.0, -1.0, -2.0, -0.5]])
    seen = torch.tensor([[1, 0, 0, 1]])
    expected = RepetitionPenaltyLogitsProcessor(1e39)(torch.tensor([[0, 3]]), logits.double())
    assert int(expected.argmax()) == 0
    assert op_tokens(SamplingParams(repetition_penalty=1e39), logits, seen) == [0]


# ---------------------------------------------------------------- served rows


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    core = tiny_core(tmp_path_factory.getbasetemp())
    runtime = build_runtime(open_core(core.path, accept=core.namespace, trusted_keys=[core.public_key]))
    yield runtime.engine
    runtime.close()


def run_requests(engine, specs: list[RequestSpec]) -> dict[str, list[TokenEvent]]:
    """Submits every spec before the first step (one mixed batch) and returns each one's token events."""
    events: dict[str, list[TokenEvent]] = {spec.request_id: [] for spec in specs}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            events[event.request_id].append(event)

    for spec in specs:
        engine.submit(EngineRequest(spec, record))
    engine.run_until_idle()
    return events


def tokens_of(events: list[TokenEvent]) -> list[int]:
    return [token for event in events for token in event.token_ids]


def logprobs_of(events: list[TokenEvent]) -> list:
    return [entry for event in events for entry in event.logprobs]


def full_logprobs(top: tuple[tuple[int, float], ...], bias: dict[int, float] = {}) -> tuple[list[int], torch.Tensor]:
    """(ids, float64 log-probabilities): the reported top tokens, then the remaining mass spread over
    pseudo-tokens each less probable than the last reported one (ids -1), with `bias` added to the
    reported ids' values and the whole renormalised (a bias shifts one logit; the rest keep their ratios)."""
    ids = [token for token, _ in top]
    values = [value + bias.get(token, 0.0) for token, value in top]
    rest = max(0.0, 1.0 - sum(math.exp(value) for _, value in top))
    smallest = math.exp(min(value for _, value in top))
    pieces = max(1, math.ceil(2 * rest / smallest))
    full = torch.tensor(values + [math.log(rest / pieces) if rest > 0 else -math.inf] * pieces, dtype=torch.float64)
    return ids + [-1] * pieces, torch.log_softmax(full, dim=-1)


def last_kept(top, params: SamplingParams, bias: dict[int, float] = {}) -> int:
    """The last token transformers' warpers keep (temperature, top-k, top-p, min-p, in `generate`'s
    order) of the reported distribution: the token the fixed largest uniform draws. It must be one
    of the reported tokens and not the last of them, so the unreported tail cannot matter."""
    ids, values = full_logprobs(top, bias)
    if params.is_greedy:
        return ids[int(values.argmax())]
    scores = TemperatureLogitsWarper(params.temperature)(None, values.unsqueeze(0))
    if params.top_k > 0:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1.0:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    if params.min_p > 0.0:
        scores = MinPLogitsWarper(params.min_p)(None, scores)
    kept = (scores[0] > -math.inf).nonzero().squeeze(-1).tolist()
    position = min(kept, key=lambda index: (float(scores[0, index]), -index))
    assert ids[position] >= 0 and position < TOP - 1, "the row's last kept token must be inside the reported ones"
    return ids[position]


def chosen_settings(top) -> dict[str, tuple[SamplingParams, dict[int, float]]]:
    """Each row's parameters and bias, chosen from the prompt's reported distribution `top` so that
    every row keeps a different number of tokens (see the module docstring)."""
    probs = np.exp([value for _, value in top])
    cumulative = np.cumsum(probs)
    ratio = lambda rank, temperature: (probs[rank] / probs[0]) ** (1 / temperature)  # noqa: E731
    between = lambda rank, temperature: math.sqrt(ratio(rank, temperature) * ratio(rank + 1, temperature))  # noqa: E731
    sampled = lambda **values: SamplingParams(**values, seed=11)  # noqa: E731
    return {
        "top_k_3": (sampled(temperature=1.0, top_k=3), {}),
        "top_k_6_cool": (sampled(temperature=0.7, top_k=6), {}),
        "top_p_rank_4": (sampled(temperature=1.0, top_p=float((cumulative[3] + cumulative[4]) / 2)), {}),
        "min_p_rank_7_warm": (sampled(temperature=1.3, min_p=between(7, 1.3)), {}),
        "top_k_10_min_p_rank_2": (sampled(temperature=1.0, top_k=10, min_p=between(2, 1.0)), {}),
        "bias_lifts_rank_12": (sampled(temperature=1.0, top_k=2),
                               {top[12][0]: top[0][1] - top[12][1] + 1.0}),
        "bias_bans_the_top": (sampled(temperature=1.0, top_k=1), {top[0][0]: -100.0}),
        "greedy": (SamplingParams(), {}),
    }


def test_each_row_of_a_mixed_batch_samples_with_its_own_parameters(engine, monkeypatch):
    """Eight requests for one prompt, side by side in one batch, each with other parameters (and
    two with a logit bias): each gets its own last kept token; without logprobs (the plain programs)."""
    (reported,) = logprobs_of(run_requests(engine, [RequestSpec("reported", PROMPT, 1, top_logprobs=TOP)])["reported"])
    top = reported.top
    settings = chosen_settings(top)
    expected = {name: last_kept(top, params, bias) for name, (params, bias) in settings.items()}
    assert len(set(expected.values())) >= 6  # the rows differ, so a row given another's parameters shows
    monkeypatch.setattr(sampling, "uniform53", lambda words: torch.full(
        (words.shape[0],), LAST_UNIFORM, dtype=torch.float64, device=words.device))
    specs = [RequestSpec(name, PROMPT, 1, sampling=params, logit_bias=tuple(bias.items()))
             for name, (params, bias) in settings.items()]
    got = {name: tokens_of(events) for name, events in run_requests(engine, specs).items()}
    assert got == {name: [token] for name, token in expected.items()}


def test_each_decode_row_filters_its_own_reported_distribution(engine, monkeypatch):
    """Requests with other parameters decoding side by side, asking for logprobs (the token-logprobs
    programs): at every step each row's token is the last its filters keep of the distribution
    reported for that row and step (penalties included, which differ per row as outputs differ)."""
    monkeypatch.setattr(sampling, "uniform53", lambda words: torch.full(
        (words.shape[0],), LAST_UNIFORM, dtype=torch.float64, device=words.device))
    settings = {
        "top_k_2": SamplingParams(temperature=1.0, top_k=2, seed=1),
        "top_k_5_cool": SamplingParams(temperature=0.5, top_k=5, seed=2),
        "top_k_4_penalised": SamplingParams(temperature=1.2, top_k=4, repetition_penalty=1.3, presence_penalty=1.5,
                                            frequency_penalty=0.5, seed=3),
        "top_k_3_biased": SamplingParams(temperature=1.0, top_k=3, seed=4),
        "greedy": SamplingParams(),
    }
    biases = {"top_k_3_biased": ((5, 2.5), (9, -3.0))}
    specs = [RequestSpec(name, PROMPT, 4, top_logprobs=TOP, sampling=params, logit_bias=biases.get(name, ()))
             for name, params in settings.items()]
    events = run_requests(engine, specs)
    steps = 0
    for name, params in settings.items():
        for token, entry in zip(tokens_of(events[name]), logprobs_of(events[name]), strict=True):
            assert token == last_kept(entry.top, params), name  # reported values are already biased
            steps += 1
    assert steps == 4 * len(settings)
    assert len({tuple(tokens_of(events[name])) for name in settings}) == len(settings)


# ---------------------------------------------------------------- through the API


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_tiny_core(tmp_path_factory.getbasetemp(), frontend_workers=2) as served:
        yield served


def test_a_huge_top_k_is_served_as_off(served):
    """top_k 10**400 (valid JSON and within the API's bounds) was a 500 "execution failed:
    OverflowError"; it samples as top_k 0 does."""
    async def complete(**fields):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(served)),
                                     base_url="http://test") as client:
            response = await client.post("/v1/completions", json=dict(
                model=SERVED_ID, prompt=list(PROMPT), max_tokens=4, temperature=1.0, seed=7,
                return_token_ids=True, **fields))
            return response.status_code, response.json()

    status, body = asyncio.run(complete(top_k=10**400))
    assert status == 200, body
    assert body["choices"][0]["token_ids"] == asyncio.run(complete(top_k=0))[1]["choices"][0]["token_ids"]


def test_penalties_count_the_whole_prompt_whether_it_was_cached_or_shared(engine):
    """A penalised request's prompt histogram holds its whole prompt (transformers' repetition
    penalty reads every input id) whether its prefix was computed, found in the prefix cache or
    shared with identical prompts in the same batch: the same tokens each time."""
    prompt = tuple(range(60, 100)) + (61, 62, 61)  # more than a prefill chunk, repeated ids
    penalised = SamplingParams(repetition_penalty=3.0, presence_penalty=1.0, frequency_penalty=0.5)

    def tokens(*names, sampling=penalised):
        events = run_requests(engine, [RequestSpec(name, prompt, 6, sampling=sampling) for name in names])
        return [tokens_of(events[name]) for name in names]

    (computed,) = tokens("computed")
    assert tokens("cached") == [computed]
    assert tokens("shared-0", "shared-1", "shared-2") == [computed] * 3
    (plain,) = tokens("plain", sampling=SamplingParams())
    assert plain != computed  # the penalties change these tokens


def test_presence_and_frequency_shift_each_rows_generated_tokens_only(engine):
    """OpenAI's definition through the runtime: beside a plain greedy row, a row with presence a and
    frequency f reports (its logprobs: after penalties) the same distribution with each token t
    that row generated c > 0 times lowered by a + f * c relative to the others, prompt ids untouched,
    at every step (the rows decode side by side and, as the penalties are small, stay on one path)."""
    presence, frequency = 0.25, 0.125
    specs = [RequestSpec("plain", PROMPT, 5, top_logprobs=TOP),
             RequestSpec("penalised", PROMPT, 5, top_logprobs=TOP,
                         sampling=SamplingParams(presence_penalty=presence, frequency_penalty=frequency))]
    events = run_requests(engine, specs)
    tokens = tokens_of(events["plain"])
    assert tokens_of(events["penalised"]) == tokens
    shifted = 0
    for step, (plain, penalised) in enumerate(zip(logprobs_of(events["plain"]), logprobs_of(events["penalised"]))):
        counts = {token: tokens[:step].count(token) for token in set(tokens[:step])}
        penalty = lambda token: presence + frequency * counts[token] if token in counts else 0.0  # noqa: E731
        plain_values, penalised_values = dict(plain.top), dict(penalised.top)
        anchor = next(token for token, _ in plain.top if token not in counts and token in penalised_values)
        for token in plain_values.keys() & penalised_values.keys():
            expected = plain_values[token] - plain_values[anchor] - penalty(token)
            assert penalised_values[token] - penalised_values[anchor] == pytest.approx(expected, abs=1e-5)
            shifted += penalty(token) > 0
    assert shifted >= 2  # generated tokens were among the reported ones
