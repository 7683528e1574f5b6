"""A seeded differential over request lifecycles on the real engine (eager programs of a tiny
random Llama 3, `tests/runtime/stress.py`'s model: pages of 4 tokens, a context of 64).

Each seed submits bursts of requests with ``n`` choices of one prompt (1-4, each choice sampled
with seed s + j as the server derives it, or greedy), output limits of 1-3 tokens and longer, and
requests that generate nothing (the frontend's ``max_tokens: 0``: one hidden token, prompt scores
or not); prompts share prefixes, and some sit at the context length, one or two below it, or one
past it (refused: `ContextExceeded`); choices end at their first token by an EOS id, a host stop
sequence or a cancellation, are cancelled while still queued or after some tokens. Every request's
tokens, end and prompt scores are checked against the same request run alone on an engine without
prefix caching (a cancelled one delivers a prefix), and after each burst the engine holds nothing:
the pool's free and parked pages are back to what they were, no prompt group member or held prompt
is left, every slot is free. Small pools make holds meet page pressure and preemption; now and then
a choice scores its prompt where the others do not (as another client's request would).

`HELIOS_LIFECYCLE_SEEDS` sets how many seeds run (default 4); the sweep's numbers are in the
README.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from helios.ignition.recipes import load_checkpoint
from helios.runtime.engine import EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, PromptScoresEvent, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import GREEDY, SamplingParams
from helios.runtime.scheduling.policy import SchedulerPolicy
from ignition.hf_checkpoints import LLAMA3_UNTIED, random_model, write_checkpoint

from .harness import assert_all_released
from .stress import CONTEXT, SAMPLED, alone_on, capacity_plan, stress_engine, stress_model

NUM_SEEDS = int(os.environ.get("HELIOS_LIFECYCLE_SEEDS", "4"))
# (pool pages, execution frames) by seed: from little more than one full-context request (16 pages)
# to a roomy pool
POOLS = ((24, 1), (64, 2), (20, 2), (40, 1), (18, 1))
WAITING, FIRST, LATER = "waiting", "first token", "later"  # where a cancellation is sent


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    return load_checkpoint(write_checkpoint(random_model(LLAMA3_UNTIED), tmp_path_factory.mktemp("llama3")))


@dataclass
class Choice:
    spec: RequestSpec
    expected: list[int]  # its output when it ends by itself
    natural: FinishReason
    scores: list  # its prompt scores alone
    cancel: str | None = None
    cancel_after: int = 0
    stop: tuple[int, ...] = ()
    tokens: list[int] = field(default_factory=list)
    finishes: list[FinishEvent] = field(default_factory=list)
    score_events: list[PromptScoresEvent] = field(default_factory=list)
    cancelled: bool = False


class Lifecycle:
    """One seed's run (module docstring)."""

    def __init__(self, recipe, seed: int):
        self.rng = random.Random(seed)
        self.vocab = recipe.architecture.vocab_size
        num_pages, frames = POOLS[seed % len(POOLS)]
        plain = SchedulerPolicy(speculative=False)
        self.engine = stress_engine(stress_model(recipe, None, capacity_plan(None), num_pages=num_pages), plain,
                                    queue_capacity=64, frames=frames)
        self.alone = stress_engine(stress_model(recipe, None, capacity_plan(None)),
                                   dataclasses.replace(plain, prefix_caching=False))
        self.bases = [self._ids(CONTEXT) for _ in range(2)]
        self.outputs: dict[RequestSpec, object] = {}
        self.count = 0
        self.choices: list[Choice] = []
        self.counts: Counter = Counter()

    def _ids(self, length: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab - 1) for _ in range(length)]

    def _alone(self, spec: RequestSpec):
        key = dataclasses.replace(spec, request_id="")
        if key not in self.outputs:
            self.count += 1
            self.outputs[key] = alone_on(self.alone, dataclasses.replace(spec, request_id=f"alone{self.count}"))
        return self.outputs[key]

    # -- requests --------------------------------------------------------------------------------

    def _group(self) -> list[Choice]:
        """One request's choices: a prompt, an output limit, then each choice's seed and ending."""
        rng = self.rng
        limit = rng.choice([0, 1, 1, 2, 3, rng.randrange(4, 13)])
        output = max(limit, 1)  # max_tokens 0: one hidden token, as the frontend asks
        room = CONTEXT if output == 1 else CONTEXT - output  # (a single token is never fed back)
        where = rng.random()
        if where < 0.3:  # at the context length, one or two below it, or one past it
            length = room - rng.choice([0, 0, 1, 2, -1])
        elif where < 0.7:  # a shared prefix and a tail
            length = rng.randrange(2, min(room, 40) + 1)
        else:
            length = rng.randrange(1, min(room, 30) + 1)
        base = rng.choice(self.bases)
        cut = rng.randrange(0, min(length, len(base)) + 1) if where < 0.7 else 0
        prompt = tuple(base[:cut] + self._ids(length - cut))
        score = limit == 0 and rng.random() < 0.6 or rng.random() < 0.1
        sampled = rng.random() < 0.5
        seed = rng.randrange(2**31)
        n = rng.choice([1, 2, 3, 4])
        group = []
        for j in range(n):
            sampling = SamplingParams.from_packed(SAMPLED, seed).with_seed(seed + j) if sampled else GREEDY
            self.counts["choices"] += 1
            scores = score != (rng.random() < 0.1)  # now and then another client's request: scored or not
            spec = RequestSpec(f"r{self.counts['choices']}", prompt, output, score_prompt=scores, sampling=sampling,
                               pinned_seed=sampled)
            group.append(self._choice(spec, refused=length > room))
        return group

    def _choice(self, spec: RequestSpec, refused: bool) -> Choice:
        if refused:
            self.counts["refused"] += 1
            return Choice(spec, [], FinishReason.REJECTED, [])
        alone = self._alone(spec)
        expected, natural = list(alone.tokens), FinishReason.LENGTH
        choice = Choice(spec, expected, natural, alone.scores)
        ending = self.rng.random()
        if ending < 0.12:  # an EOS id: its first token
            choice.spec = dataclasses.replace(spec, eos_ids=frozenset({expected[0]}))
            choice.expected, choice.natural = expected[:1], FinishReason.EOS
        elif ending < 0.22:  # a host stop sequence ending at its first token
            choice.stop = (expected[0],)
            choice.spec = dataclasses.replace(spec, stop_token_sequences=(choice.stop,))
            if len(expected) > 1:  # (at its last token the limit ends it first)
                choice.expected, choice.natural = expected[:1], FinishReason.STOP
        elif ending < 0.45:
            choice.cancel = self.rng.choice([WAITING, FIRST, FIRST, LATER])
            choice.cancel_after = 1 if choice.cancel == FIRST else self.rng.randrange(1, len(expected) + 1)
        return choice

    # -- driving ---------------------------------------------------------------------------------

    def run(self, num_bursts: int) -> None:
        scheduler = self.engine.scheduler
        available = scheduler.cache.pool.num_available
        for _ in range(num_bursts):
            burst = [choice for _ in range(self.rng.randrange(1, 5)) for choice in self._group()]
            for choice in burst:
                self._submit(choice)
            for choice in burst:
                if choice.cancel == WAITING:
                    self._cancel(choice)
            self.engine.run_until_idle()
            self.choices += burst
            self._check_idle(available)
        self.counts["holds"] = scheduler.cache.groups.num_holds
        self.counts["shared admissions"] = scheduler.cache.groups.num_shared_admissions
        self.counts["preemptions"] = scheduler.counters().preemptions
        for choice in self.choices:
            self._check(choice)

    def _submit(self, choice: Choice) -> None:
        def on_event(event) -> None:
            if isinstance(event, FinishEvent):
                choice.finishes.append(event)
            elif isinstance(event, PromptScoresEvent):
                choice.score_events.append(event)
            else:
                assert isinstance(event, TokenEvent) and not choice.finishes
                choice.tokens.extend(event.token_ids)
                if choice.cancel in (FIRST, LATER) and len(choice.tokens) >= choice.cancel_after:
                    self._cancel(choice)

        host_stop = (lambda token: token == choice.stop[0]) if choice.stop else None
        self.engine.submit(EngineRequest(choice.spec, on_event, None, host_stop))

    def _cancel(self, choice: Choice) -> None:
        if not choice.cancelled:
            choice.cancelled = True
            self.engine.cancel(choice.spec.request_id)

    def _check_idle(self, available: int) -> None:
        scheduler = self.engine.scheduler
        assert not scheduler.has_work and not self.engine._active
        scheduler.check_invariants()
        cache = scheduler.cache
        assert not cache.groups.num_members and not cache.groups.held and not scheduler.queues.num_awaiting
        assert cache.pool.num_available == available, "a page is still held"
        assert_all_released(scheduler)

    def _check(self, choice: Choice) -> None:
        name = choice.spec.request_id
        assert len(choice.finishes) == 1, (name, choice.finishes)
        finish = choice.finishes[0]
        self.counts[finish.reason.name] += 1
        assert finish.num_output_tokens == len(choice.tokens), (name, finish)
        if choice.natural == FinishReason.REJECTED:
            assert finish.reason == FinishReason.REJECTED and "context extent" in finish.message, (name, finish)
            return
        if choice.cancelled and finish.reason == FinishReason.CANCELLED:
            assert choice.tokens == choice.expected[:len(choice.tokens)], (name, choice.tokens, choice.expected)
        else:
            assert (finish.reason, choice.tokens) == (choice.natural, choice.expected), (
                name, finish.reason, choice.tokens, choice.natural, choice.expected)
        if choice.spec.score_prompt and choice.tokens:
            scores = [score for event in choice.score_events for score in event.scores]
            assert len(scores) >= len(choice.spec.prompt_ids) - 1, name
            first = {}
            for event in choice.score_events:
                for offset, score in enumerate(event.scores):
                    first.setdefault(event.first_index + offset, score)
            assert sorted(first) == list(range(1, len(choice.spec.prompt_ids))), name
            for index, score in first.items():
                assert abs(score.logprob - choice.scores[index - 1].logprob) < 1e-4, (name, index)


SEED_COUNTS: dict[int, Counter] = {}  # each seed's counts, for the edge check below


def run_seed(recipe, seed: int) -> Counter:
    if seed not in SEED_COUNTS:
        run = Lifecycle(recipe, seed)
        run.run(num_bursts=4)
        SEED_COUNTS[seed] = run.counts
    return SEED_COUNTS[seed]


@pytest.mark.parametrize("seed", range(NUM_SEEDS))
def test_lifecycle_differential(recipe, seed):
    run_seed(recipe, seed)


def test_the_seeds_meet_every_edge(recipe):
    """What the differential is for happened over the seeds run (any one seed may miss some)."""
    total = sum((run_seed(recipe, seed) for seed in range(NUM_SEEDS)), Counter())
    print(f"{NUM_SEEDS} seeds:", dict(total))  # (the sweep's numbers, with -s)
    edges = ("holds", "shared admissions", "refused", "preemptions", "LENGTH", "EOS", "STOP", "CANCELLED")
    assert all(total[edge] for edge in edges), total


# -- the edges the sweep draws, pinned ----------------------------------------------------------------

def serve(engine, choices: list[Choice]) -> list:
    """Runs `choices` at once on `engine` (ending as each says); returns the plans it ran."""
    plans, schedule = [], engine.scheduler.schedule

    def recording():
        plan = schedule()
        if plan is not None:
            plans.append(plan)
        return plan

    engine.scheduler.schedule = recording
    run = Lifecycle.__new__(Lifecycle)
    run.engine = engine
    for choice in choices:
        run._submit(choice)
    engine.run_until_idle()
    del engine.scheduler.schedule
    return plans


def prompt_positions(plans, prompt_len: int) -> int:
    return sum(max(0, min(r.start_pos + r.query_len, prompt_len) - r.start_pos) for plan in plans for r in plan.rows)


def engines(recipe, num_pages: int | None = None):
    """(an engine sharing prompts, one running each request as if alone: no prefix caching)."""
    plain = SchedulerPolicy(speculative=False)
    shared = stress_engine(stress_model(recipe, None, capacity_plan(None), num_pages=num_pages), plain)
    alone = stress_engine(stress_model(recipe, None, capacity_plan(None)),
                          dataclasses.replace(plain, prefix_caching=False))
    return shared, alone


@pytest.mark.parametrize("ending", ["limit", "eos", "stop", "cancel"])
def test_seeded_choices_whose_first_ends_at_its_first_token_equal_independent_requests(recipe, ending):
    """Choice 0 of four ends at its first token while the others wait for its prompt: they are
    admitted together onto the held prompt (19 + 3 prompt positions computed, not 19 + 3 x 3), and
    each gives the tokens of the same request alone (seed s + j)."""
    engine, alone = engines(recipe)
    available = engine.scheduler.cache.pool.num_available
    rng = random.Random(11)
    prompt = tuple(rng.randrange(1, 120) for _ in range(19))  # position 18: on a page after 2 prompt tokens
    specs = [RequestSpec(f"c{j}", prompt, 1 if (ending == "limit" and j == 0) else 6, pinned_seed=True,
                         sampling=SamplingParams.from_packed(SAMPLED, 1234 + j)) for j in range(4)]
    expected = [alone_on(alone, spec).tokens for spec in specs]
    choices = [Choice(spec, tokens, FinishReason.LENGTH, []) for spec, tokens in zip(specs, expected)]
    first = choices[0]
    if ending == "eos":
        first.spec = dataclasses.replace(first.spec, eos_ids=frozenset({expected[0][0]}))
    elif ending == "stop":
        first.stop = (expected[0][0],)
        first.spec = dataclasses.replace(first.spec, stop_token_sequences=(first.stop,))
    elif ending == "cancel":
        first.cancel, first.cancel_after = FIRST, 1
    plans = serve(engine, choices)
    reason = {"limit": FinishReason.LENGTH, "eos": FinishReason.EOS, "stop": FinishReason.STOP,
              "cancel": FinishReason.CANCELLED}[ending]
    assert (first.finishes[0].reason, first.tokens) == (reason, expected[0][:1])
    assert [choice.tokens for choice in choices[1:]] == expected[1:]
    assert len({tuple(tokens) for tokens in expected[1:]}) > 1  # seeds s + j: the choices differ
    assert prompt_positions(plans, len(prompt)) == 19 + 3
    groups = engine.scheduler.cache.groups
    assert (groups.num_holds, groups.num_shared_admissions) == (1, 3) and not groups.held
    assert engine.scheduler.cache.pool.num_available == available
    assert_all_released(engine.scheduler)


def test_a_prompt_of_the_whole_context_is_served_when_it_generates_nothing(recipe):
    """An output limit of one token (the frontend's ``max_tokens: 0``) takes only its prompt: a
    prompt of the whole context is served, scored or not, and alone or as three choices it gives
    the same token; one more prompt token, or a second output token, is refused by name."""
    engine, alone = engines(recipe)
    available = engine.scheduler.cache.pool.num_available
    rng = random.Random(12)
    prompt = tuple(rng.randrange(1, 120) for _ in range(CONTEXT))
    for score in (False, True):
        spec = RequestSpec("full", prompt, 1, score_prompt=score)
        result = alone_on(alone, spec)
        assert len(result.tokens) == 1 and len(result.scores) == (CONTEXT - 1 if score else 0)
        if score:  # each prompt token's score is the one it has in a prompt one token shorter
            shorter = alone_on(alone, RequestSpec("shorter", prompt[:-1], 1, score_prompt=True))
            assert all(abs(a.logprob - b.logprob) < 1e-4 for a, b in zip(result.scores, shorter.scores))
        specs = [RequestSpec(f"n{score}{j}", prompt, 1, score_prompt=score, pinned_seed=True,
                             sampling=SamplingParams.from_packed(SAMPLED, 77 + j)) for j in range(3)]
        choices = [Choice(s, alone_on(alone, s).tokens, FinishReason.LENGTH, []) for s in specs]
        plans = serve(engine, choices)
        assert all((c.finishes[0].reason, c.tokens) == (FinishReason.LENGTH, c.expected) for c in choices)
        if not score:  # (scored prompts are computed by each: every token needs its score)
            assert prompt_positions(plans, CONTEXT) == CONTEXT + 2
    for shape in ((prompt + (5,), 1), (prompt, 2), (prompt[:-1], 2)):
        refused = Choice(RequestSpec(f"over{len(shape[0])}.{shape[1]}", *shape), [], FinishReason.REJECTED, [])
        serve(engine, [refused])
        (finish,) = refused.finishes
        assert finish.reason == FinishReason.REJECTED and finish.message.endswith(
            f"{len(shape[0])} prompt + {shape[1]} output tokens exceed the context extent {CONTEXT}"), finish
    assert engine.scheduler.cache.pool.num_available == available
    assert_all_released(engine.scheduler)
