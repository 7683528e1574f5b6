"""Offline batch generation through the engine: every prompt in one batch, run to completion.

Used by `helios generate` and by tests; drives the engine synchronously in the calling thread (the
engine must not be started).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from helios.abi.sampling import NEUTRAL_SAMPLING_PARAMETERS
from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.execution.packer import AdmissionValues
from helios.runtime.records.request import RequestSpec


@dataclass(frozen=True)
class SamplingChoice:
    """Packed sampling parameters (see `helios.abi.sampling.SAMPLING_PARAMETER_COLUMNS`) and seed."""

    parameters: tuple[float, ...] = NEUTRAL_SAMPLING_PARAMETERS
    seed: int = 0


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    message: str = ""


def generate(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: int, eos_ids: Sequence[int] = (),
             sampling: SamplingChoice = SamplingChoice()) -> list[Generation]:
    """Generates for every prompt (one request each, all submitted before the first step)."""
    tokens: dict[str, list[int]] = {}
    finished: dict[str, FinishEvent] = {}

    def record(event) -> None:
        if isinstance(event, TokenEvent):
            tokens[event.request_id].extend(event.token_ids)
        else:
            finished[event.request_id] = event

    ids = [f"offline-{index}" for index in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts):
        tokens[request_id] = []
        spec = RequestSpec(request_id, tuple(prompt), max_tokens, frozenset(eos_ids))
        admission = AdmissionValues(tuple(prompt), sampling.seed, tuple(sampling.parameters), max_tokens, tuple(eos_ids))
        engine.submit(EngineRequest(spec, admission, record))
    engine.run_until_idle()
    return [
        Generation(tuple(tokens[r]), finished[r].reason, finished[r].num_prompt_tokens, finished[r].message)
        for r in ids
    ]
