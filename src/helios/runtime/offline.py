"""Offline batch generation through the engine: every prompt in one batch, run to completion.

Used by `helios generate` and by tests; drives the engine synchronously in the calling thread (the
engine must not be started).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import GREEDY, SamplingParams


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    message: str = ""


def generate(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: int | Sequence[int],
             eos_ids: Sequence[int] = (), sampling: SamplingParams = GREEDY,
             pinned_seed: bool = False) -> list[Generation]:
    """Generates for every prompt (one request each, all submitted before the first step), up to
    `max_tokens` each (one limit for all, or one per prompt).

    `pinned_seed` promises each sampled prompt the tokens its seed draws alone, whatever else runs
    beside it: its requests run single-token lanes (`RequestSpec.pinned_seed`), as a server request
    with a chosen seed does; otherwise a speculative core may verify a sampled prompt's drafted runs,
    whose draws depend on where its rounds fall and so on its neighbours (the same distribution,
    other tokens)."""
    limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"{len(limits)} output limits for {len(prompts)} prompts")
    tokens: dict[str, list[int]] = {}
    finished: dict[str, FinishEvent] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)
        else:
            finished[event.request_id] = event

    ids = [f"offline-{index}" for index in range(len(prompts))]
    for request_id, prompt, limit in zip(ids, prompts, limits):
        tokens[request_id] = []
        spec = RequestSpec(request_id, tuple(prompt), limit, frozenset(eos_ids), sampling=sampling,
                           pinned_seed=pinned_seed)
        engine.submit(EngineRequest(spec, record))
    engine.run_until_idle()
    return [
        Generation(tuple(tokens[r]), finished[r].reason, finished[r].num_prompt_tokens, finished[r].message)
        for r in ids
    ]
