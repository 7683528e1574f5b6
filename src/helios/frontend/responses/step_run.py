"""Consecutive output steps of one stream presented as one (`StepRun`).

When a stream's reader is behind, several of its steps are waiting when its writer runs (see
`helios.server.responses`); they are presented as one run instead of one set of chunks per token,
the way production servers merge a request's pending outputs when the consumer lags. A run
concatenates, in order, its steps' observed ids (with their timestamps), parser events and
log-probability entries; the prompt's entries ride on the run that holds the first step after them.
Presented (`StreamPresenter.sse_run`), the run gives the same stream a client accumulates from
its steps one by one: the same text (chat deltas of one kind merge, tool-call fragments join
their call), the same ``token_ids`` and ``token_timestamps_ns`` concatenated, the same
log-probability entries with the same text offsets; only the number of chunks is smaller.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

from helios.frontend.decoding.events import Event
from helios.frontend.decoding.logprobs import LogprobEntry
from helios.frontend.decoding.observation import TokenObservation
from helios.frontend.responses.output import OutputStep


class StepRun(NamedTuple):
    """Steps of one stream in order, concatenated (see the module docstring). A named tuple: one
    is built per write of every stream, and a frozen dataclass costs several times as much."""

    observations: tuple[TokenObservation, ...]
    events: tuple[Event, ...]
    logprobs: tuple[LogprobEntry, ...] = ()
    prompt_logprobs: tuple[LogprobEntry, ...] | None = None
    num_output_tokens: int = 0  # output tokens usage counts after the run's last step

    @classmethod
    def of(cls, steps: Sequence[OutputStep]) -> StepRun:
        """The run of `steps` (at least one)."""
        if len(steps) == 1:
            step = steps[0]
            observations = () if step.observation is None else (step.observation,)
            return cls(observations, step.events, step.logprobs, step.prompt_logprobs, step.num_output_tokens)
        observations, events, logprobs = [], [], []
        prompt = None
        for step in steps:
            if step.observation is not None:
                observations.append(step.observation)
            events.extend(step.events)
            logprobs.extend(step.logprobs)
            if prompt is None:
                prompt = step.prompt_logprobs
        return cls(tuple(observations), tuple(events), tuple(logprobs), prompt, steps[-1].num_output_tokens)


def runs_of(items: Sequence) -> list:
    """`items` with each stretch of consecutive `OutputStep`s replaced by one `StepRun`."""
    out: list = []
    pending: list[OutputStep] = []
    for item in items:
        if isinstance(item, OutputStep):
            pending.append(item)
            continue
        if pending:
            out.append(StepRun.of(pending))
            pending = []
        out.append(item)
    if pending:
        out.append(StepRun.of(pending))
    return out
