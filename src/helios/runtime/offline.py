"""Offline batch generation through the engine: every prompt in one batch, run to completion.

Used by `helios generate` and by tests; drives the engine synchronously in the calling thread (the
engine must not be started). A caller that may stop the run part-way (`helios generate` on Ctrl-C
or SIGTERM) passes its own `OfflineOutputs`, filled as the prompts' outputs come, so that what the
prompts had generated outlives the exception that ended `generate`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from helios.runtime.engine import Engine, EngineRequest
from helios.runtime.records.events import FinishEvent, FinishReason, TokenEvent
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import GREEDY, SamplingParams

UNFINISHED_MESSAGE = "interrupted before it finished"


@dataclass(frozen=True)
class Generation:
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    message: str = ""


class OfflineOutputs:
    """Each prompt's output as the engine reports it: its tokens so far and, once it ended, its end."""

    def __init__(self, prompts: Sequence[Sequence[int]]):
        self._prompt_lens = [len(prompt) for prompt in prompts]
        self._tokens: list[list[int]] = [[] for _ in prompts]
        self._ends: list[FinishEvent | None] = [None] * len(prompts)

    def __len__(self) -> int:
        return len(self._prompt_lens)

    def recorder(self, index: int):
        """The event callback of prompt `index`'s request."""
        def record(event) -> None:
            if isinstance(event, TokenEvent):
                self._tokens[index].extend(event.token_ids)
            else:
                self._ends[index] = event
        return record

    def generations(self) -> list[Generation]:
        """Every prompt's output now, in order; one that has not ended is its tokens so far, CANCELLED
        (what the engine's shutdown, later, ends it with). A copy: events recorded later (the
        shutdown's wind-down) are not among them."""
        return [
            Generation(tuple(tokens), end.reason, end.num_prompt_tokens, end.message) if end is not None
            else Generation(tuple(tokens), FinishReason.CANCELLED, prompt_len, UNFINISHED_MESSAGE)
            for prompt_len, tokens, end in zip(self._prompt_lens, self._tokens, self._ends)
        ]


def generate(engine: Engine, prompts: Sequence[Sequence[int]], max_tokens: int | Sequence[int],
             eos_ids: Sequence[int] = (), sampling: SamplingParams = GREEDY,
             pinned_seed: bool = False, outputs: OfflineOutputs | None = None) -> list[Generation]:
    """Generates for every prompt (one request each, all submitted before the first step), up to
    `max_tokens` each (one limit for all, or one per prompt); `outputs`, where given (made for these
    `prompts`), is filled as the outputs come, and keeps them if the run is stopped by an exception
    (the engine is then left to its owner's shutdown).

    `pinned_seed` promises each sampled prompt the tokens its seed draws alone, whatever else runs
    beside it: its requests run single-token lanes (`RequestSpec.pinned_seed`), as a server request
    with a chosen seed does; otherwise a speculative core may verify a sampled prompt's drafted runs,
    whose draws depend on where its rounds fall and so on its neighbours (the same distribution,
    other tokens)."""
    limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    if len(limits) != len(prompts):
        raise ValueError(f"{len(limits)} output limits for {len(prompts)} prompts")
    outputs = OfflineOutputs(prompts) if outputs is None else outputs
    if len(outputs) != len(prompts):
        raise ValueError(f"outputs for {len(outputs)} prompts given for {len(prompts)} prompts")
    for index, (prompt, limit) in enumerate(zip(prompts, limits)):
        spec = RequestSpec(f"offline-{index}", tuple(prompt), limit, frozenset(eos_ids), sampling=sampling,
                           pinned_seed=pinned_seed)
        engine.submit(EngineRequest(spec, outputs.recorder(index)))
    engine.run_until_idle()
    return outputs.generations()
