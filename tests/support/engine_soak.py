"""A seeded soak of the real engine through its public API, on any device.

`EngineSoak(engine, settings, probe).run()` drives an unstarted `Engine` from the calling thread
with `submit`, `cancel` and `run_until_idle` only. Requests arrive over time: a burst whenever the
engine went idle, and one more with some chance at every token event (the event callbacks run in
the model worker - here this thread - as a frontend's handlers would). Cancellations land at random
points too: at a token event a random open request is cancelled, which may still sit in the
ingress channel (submitted in this very callback), wait in the scheduler or be running; now and
then an already finished one is cancelled (which must change nothing). Prompts share prefixes, so
prefix-cache pages are published, parked and reused; some requests sample, the rest are greedy.

`probe()` (e.g. the CUDA allocation counter) is read when `settings.warmup` requests have ended and
again at the end (`readings`). `check_soak` asserts what must hold afterwards.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from helios.abi.sampling import NEUTRAL_SAMPLING_PARAMETERS
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.request import RequestSpec

SAMPLED_PARAMETERS = (0.8, 0.0, 0.9, 0.0, 1.0, 0.0, 0.0)  # temperature 0.8, top-p 0.9


@dataclass(frozen=True)
class SoakSettings:
    num_requests: int
    seed: int = 0
    max_prompt: int = 40  # tokens; prompts longer than the prefill extent are chunked
    max_tokens: int = 12  # output limit drawn from 1..max_tokens
    burst: int = 6  # requests submitted when the engine went idle
    arrival: float = 0.15  # chance per token event that a request arrives
    cancel: float = 0.03  # chance per token event that a cancellation is sent
    sampled: float = 0.3  # share of sampling requests (the rest are greedy)
    warmup: int = 0  # ended requests before the first probe reading


@dataclass
class SoakRequest:
    request_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    sampled: bool
    tokens: list[int] = field(default_factory=list)
    finishes: list[FinishEvent] = field(default_factory=list)
    cancelled: bool = False  # the soak asked to cancel it


class EngineSoak:
    """One soak run over `engine` (see the module docstring). Single-threaded; not reusable."""

    def __init__(self, engine: Engine, settings: SoakSettings, probe: Callable[[], int] | None = None):
        self.engine = engine
        self.settings = settings
        self.probe = probe
        self.readings: list[int] = []
        self.requests: dict[str, SoakRequest] = {}
        self._open: list[str] = []
        self._ended = 0
        self._rng = random.Random(settings.seed)
        self._vocab = engine.scheduler.caps.input_vocab_size
        self._shared = [self._tokens(24) for _ in range(3)]

    def run(self) -> None:
        settings = self.settings
        while len(self.requests) < settings.num_requests:
            for _ in range(min(settings.burst, settings.num_requests - len(self.requests))):
                self._arrive()
            self.engine.run_until_idle()
        if self.probe is not None:
            self.readings.append(self.probe())

    def _tokens(self, count: int) -> list[int]:
        return [self._rng.randrange(3, self._vocab) for _ in range(count)]

    def _arrive(self) -> None:
        rng, settings = self._rng, self.settings
        prefix = rng.choice(self._shared)[:rng.randrange(25)] if rng.random() < 0.5 else []
        length = rng.randrange(len(prefix) + 1, max(settings.max_prompt, len(prefix) + 1) + 1)
        prompt = tuple(prefix + self._tokens(length - len(prefix)))
        request = SoakRequest(f"soak-{len(self.requests)}", prompt, rng.randint(1, settings.max_tokens),
                              rng.random() < settings.sampled)
        self.requests[request.request_id] = request
        self._open.append(request.request_id)
        parameters = SAMPLED_PARAMETERS if request.sampled else NEUTRAL_SAMPLING_PARAMETERS
        spec = RequestSpec(request.request_id, prompt, request.max_tokens)
        admission = AdmissionValues(prompt, rng.randrange(2**62), parameters, request.max_tokens)
        self.engine.submit(EngineRequest(spec, admission, self._on_event))

    def _on_event(self, event) -> None:
        request = self.requests[event.request_id]
        if isinstance(event, FinishEvent):
            request.finishes.append(event)
            self._open.remove(request.request_id)
            self._ended += 1
            if self.probe is not None and self._ended == self.settings.warmup:
                self.readings.append(self.probe())
            return
        request.tokens.extend(event.token_ids)
        rng = self._rng
        if rng.random() < self.settings.arrival and len(self.requests) < self.settings.num_requests:
            self._arrive()
        if rng.random() < self.settings.cancel:
            pool = self._open if self._open and rng.random() < 0.9 else list(self.requests)
            victim = self.requests[rng.choice(pool)]
            victim.cancelled |= not victim.finishes
            self.engine.cancel(victim.request_id)


def check_soak(soak: EngineSoak) -> Counter:
    """Every request ended exactly once, by its limit or (only if cancelled) by cancellation, with
    as many tokens as its finish reports; the engine is idle and holds no request, slot or page
    (every page free or parked in the prefix cache). Returns the finish reasons' counts."""
    reasons: Counter = Counter()
    vocab = soak.engine.scheduler.caps.vocab_size
    for request in soak.requests.values():
        name = request.request_id
        assert len(request.finishes) == 1, f"{name}: {request.finishes}"
        finish = request.finishes[0]
        reasons[finish.reason] += 1
        assert finish.num_output_tokens == len(request.tokens), name
        assert all(0 <= token < vocab for token in request.tokens), name
        if finish.reason == FinishReason.LENGTH:
            assert len(request.tokens) == request.max_tokens, name
        else:
            assert finish.reason == FinishReason.CANCELLED and request.cancelled, f"{name}: {finish}"
            assert len(request.tokens) < request.max_tokens, name
    scheduler = soak.engine.scheduler
    assert not scheduler.has_work and not scheduler.queues.requests
    scheduler.check_invariants()
    assert scheduler.slots.num_free == scheduler.slots.num_slots
    pool = scheduler.cache.pool
    assert pool.allocator.num_free + pool.cache.num_parked == pool.num_pages
    return reasons


def greedy_completed(soak: EngineSoak) -> list[SoakRequest]:
    """Greedy requests that ran to their output limit (their tokens are a function of the prompt)."""
    return [r for r in soak.requests.values()
            if not r.sampled and r.finishes and r.finishes[0].reason == FinishReason.LENGTH]
