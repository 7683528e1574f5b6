"""Prompt scores: the log-probabilities a SCORED_PREFILL step computed for its prompt tokens.

A scored-prefill program returns, for every packed token, the log-probability of the token after it
(``target_logprobs`` [T]) and, in cores prepared since prompt scores are served, the most probable
next ids with theirs (``target_top_ids`` / ``target_top_logprobs`` [T, K]); rows are packed in plan
order. `prompt_score_events` turns one completed plan's outputs into a `PromptScoresEvent` per row:
packed position p scores prompt token p + 1, so a row covering positions [start, start + n) scores
prompt tokens start + 1 .. start + n, up to the last prompt token (the last position predicts the
first output token, which the token event reports). The first prompt token has no score.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import torch

from helios.contract.views import TARGET_LOGPROB_OUTPUTS
from helios.runtime.records.capacities import Operation
from helios.runtime.records.events import PromptScoresEvent, TokenLogprobs
from helios.runtime.records.plan import StepPlan


def prompt_score_events(plan: StepPlan, outputs: Mapping[str, torch.Tensor],
                        prompt_lens: Mapping[str, int]) -> list[PromptScoresEvent]:
    """One event per row of a SCORED_PREFILL `plan` whose request is in `prompt_lens`; [] for
    other plans (or a program without the scores output)."""
    if plan.operation != Operation.SCORED_PREFILL or TARGET_LOGPROB_OUTPUTS[0] not in outputs:
        return []
    num_tokens = sum(row.query_len for row in plan.rows)
    scores = outputs[TARGET_LOGPROB_OUTPUTS[0]][:num_tokens].tolist()
    top_ids = top_values = None
    if TARGET_LOGPROB_OUTPUTS[1] in outputs:
        top_ids = outputs[TARGET_LOGPROB_OUTPUTS[1]][:num_tokens].tolist()
        top_values = outputs[TARGET_LOGPROB_OUTPUTS[2]][:num_tokens].tolist()
    events, offset = [], 0
    for row in plan.rows:
        prompt_len = prompt_lens.get(row.request_id)
        if prompt_len is not None:
            count = max(0, min(row.query_len, prompt_len - 1 - row.start_pos))
            span = range(offset, offset + count)
            values = tuple(TokenLogprobs(scores[i], _top(top_ids, top_values, i)) for i in span)
            if values:
                events.append(PromptScoresEvent(row.request_id, row.start_pos + 1, values))
        offset += row.query_len
    return events


def _top(ids: Sequence | None, values: Sequence | None, index: int) -> tuple[tuple[int, float], ...]:
    if ids is None:
        return ()
    return tuple(zip(ids[index], values[index]))
