"""Typed events the scheduler emits for each request, in order.

A request yields zero or more `TokenEvent`s (preceded, for a request run through scored prefill,
by its `PromptScoresEvent`s) and then exactly one `FinishEvent`. Token events of
observed requests carry `observed_ns`: one host clock read right after validated completion
(before grammar advancement, stop handling or parsing); unobserved requests read no clock and
carry None. Token events of a request that asks for log-probabilities (`RequestSpec.top_logprobs`)
carry one `TokenLogprobs` per token in `logprobs`; others carry None.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Union


class FinishReason(enum.IntEnum):
    """Why a request ended. Distinct reasons keep distinct termination semantics downstream."""

    UNSPECIFIED = 0
    EOS = 1  # sampled one of the request's EOS ids (the EOS token is the last output token)
    LENGTH = 2  # reached its output limit
    STOP = 3  # a host stop (string or token sequence) matched; reported through `Scheduler.stop`
    CANCELLED = 4  # the client cancelled or dropped the response
    REJECTED = 5  # admission refused it (engines report rejections raised by `submit` this way)
    ERROR = 6  # its execution failed or its completion record was invalid
    # its output grammar allowed no token after an incomplete output (a dead end); reported through
    # `Scheduler.dead_end` before the token the grammar's error mask would force
    GRAMMAR_DEAD_END = 7
    # its output grammar's matcher refused to go on after some output (one of llguidance's limits, or
    # a token its mask allowed that its parser then refused); the engine's, not the scheduler's: the
    # output is every token the grammar took (`helios.runtime.feedback`)
    GRAMMAR_LIMIT = 8


class TokenLogprobs(NamedTuple):
    """One sampled token's log-probability under the distribution it was drawn from (after
    penalties and grammar mask, before temperature and filters; see `helios.abi.token_logprobs`)
    and the request's number of most probable (id, log-probability) alternatives, most probable
    first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class TokenEvent(NamedTuple):
    request_id: str
    token_ids: tuple[int, ...]
    observed_ns: int | None
    logprobs: tuple[TokenLogprobs, ...] | None = None  # one per token, for requests that ask


class PromptScoresEvent(NamedTuple):
    """Scores of prompt tokens ``first_index`` .. ``first_index + len(scores) - 1`` (prompt token
    indices, from 1: the first prompt token has none) of a request run through scored prefill:
    each token's log-probability after the tokens before it and the most probable alternatives the
    program returns (`helios.runtime.execution.prompt_scores`). Precedes the request's token events; a long
    prompt's scores may come in several events, in order."""

    request_id: str
    first_index: int
    scores: tuple[TokenLogprobs, ...]


class FinishEvent(NamedTuple):
    request_id: str
    reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    num_reused_tokens: int  # prompt tokens served from cached pages or a snapshot at first admission
    message: str = ""


RequestEvent = Union[TokenEvent, PromptScoresEvent, FinishEvent]


def rejected(request_id: str, num_prompt_tokens: int, message: str) -> FinishEvent:
    """The terminal event an engine emits for a request whose `submit` raised `AdmissionRejected`."""
    return FinishEvent(request_id, FinishReason.REJECTED, num_prompt_tokens, 0, 0, message)
