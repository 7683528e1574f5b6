"""What the engine needs to generate one request: resolved sampling values and limits.

`resolve_sampling` merges a request's explicit sampling fields over the model's resolved defaults
(`helios.contract.settings.ResolvedSampling`: the core's prepared recommendations under startup
options): explicit request values win. `resolve_output_limit` chooses the output token limit.
`GenerationParams` is the frozen record handed to the engine with the prompt ids; the frontend
keeps the output-side state (detokenizer, stops, parsers) to itself.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Protocol

from helios.contract import serving_pb2 as spb
from helios.contract.settings import ResolvedSampling
from helios.errors import RequestError
from helios.runtime.records.request import RequestSpec
from helios.runtime.records.sampling_params import SamplingParams, signed_seed

__all__ = ["ContextLimitExceeded", "GenerationParams", "SamplingBody", "SamplingParams", "resolve_output_limit",
           "resolve_sampling", "scored_prompt_limit"]
# The request fields (and model defaults) of the same names as `SamplingParams`' values.
SAMPLING_FIELDS = tuple(f.name for f in dataclasses.fields(SamplingParams) if f.name != "seed")


class SamplingBody(Protocol):
    """Explicit sampling fields of a request; None means "use the default"."""

    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    repetition_penalty: float | None
    presence_penalty: float | None
    frequency_penalty: float | None
    seed: int | None


def resolve_sampling(body: SamplingBody, defaults: ResolvedSampling, draw_seed: Callable[[], int]) -> SamplingParams:
    """Explicit request values, else the defaults; ``top_p`` 0 (OpenAI's lower bound) keeps only
    the most probable token, as top_k 1 (the sampling programs' top_p is above 0). A request seed (signed 64-bit) is used as given;
    without one, a fixed seed policy uses the default seed and a random policy draws fresh bits with
    `draw_seed` (called only then), both unsigned bits converted once to the signed seed."""
    values = {}
    for name in SAMPLING_FIELDS:
        given = getattr(body, name)
        values[name] = given if given is not None else getattr(defaults, name)
    if body.top_p == 0:  # the smallest nucleus: the most probable token alone, whatever top_k says
        values.update(top_p=1.0, top_k=1)
    if body.seed is not None:
        seed = signed_seed(body.seed)  # already signed (the schema's range): unchanged
    elif defaults.seed_policy == spb.SEED_POLICY_FIXED and defaults.seed is not None:
        seed = signed_seed(defaults.seed)
    else:
        seed = signed_seed(draw_seed())
    return SamplingParams(**values, seed=seed)


def is_seed_pinned(body: SamplingBody, defaults: ResolvedSampling) -> bool:
    """Whether `resolve_sampling` takes a chosen seed (the request's, or a fixed policy's) rather
    than fresh bits: the same request then promises the same tokens."""
    return body.seed is not None or (defaults.seed_policy == spb.SEED_POLICY_FIXED and defaults.seed is not None)


class ContextLimitExceeded(RequestError):
    """A request that can never fit the context extent: its prompt leaves no room for one output
    token (a request that generates nothing: its prompt is longer than the extent), or its prompt
    plus explicit output limit exceed the extent (HTTP 400, naming the limit).
    `param` is the field at fault: the output limit the body sent, or the prompt's field when the
    prompt alone fills the context."""


def resolve_output_limit(requested: int | None, default_limit: int, context_tokens: int, prompt_len: int,
                         field: str = "max_tokens", prompt_field: str = "prompt") -> int:
    """The request's output limit: an explicit value as given, else the default limit reduced to
    the context left after the prompt ("up to the rest of the context"). `ContextLimitExceeded`
    when the request can never fit `context_tokens`, whatever the load, naming `field` (the output
    limit the body sent) or `prompt_field`."""
    room = context_tokens - prompt_len
    if room < 1:
        raise ContextLimitExceeded(
            f"the prompt is {prompt_len} tokens; the context extent is {context_tokens} tokens, which "
            "leaves no room for output: shorten the prompt", prompt_field)
    if requested is None:
        return min(default_limit, room)
    if requested > room:
        raise ContextLimitExceeded(
            f"the prompt ({prompt_len} tokens) plus {field} ({requested}) exceed the context extent "
            f"of {context_tokens} tokens: ask for at most {room} output token{'s' if room > 1 else ''}, or omit {field} for "
            "up to the rest of the context", field)
    return requested


def scored_prompt_limit(context_tokens: int, prompt_len: int, prompt_field: str = "prompt") -> int:
    """The output limit of a request that generates nothing (``max_tokens: 0``: an echo, prompt
    scores): 1, the token its prompt row samples anyway and the output hides. That token is never
    fed back, so the prompt alone must fit: up to the whole context extent. `ContextLimitExceeded`
    naming `prompt_field` for a longer prompt."""
    if prompt_len > context_tokens:
        raise ContextLimitExceeded(
            f"the prompt is {prompt_len} tokens; the context extent is {context_tokens} tokens, and max_tokens 0 "
            "needs the prompt to fit it: shorten the prompt", prompt_field)
    return 1


@dataclass(frozen=True)
class GenerationParams:
    """The engine's view of one prepared request besides its prompt ids.

    `stop_token_sequences` holds single stop ids as sequences of one. `is_constrained`: a grammar
    matcher masks every sampled token. `is_timed`: the scheduler stamps token completions.
    Requests with host stops or a grammar run one outstanding round at width one.
    """

    sampling: SamplingParams
    max_output_tokens: int
    eos_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...] = ()
    stop_token_sequences: tuple[tuple[int, ...], ...] = ()
    is_constrained: bool = False
    is_timed: bool = False
    top_logprobs: int | None = None  # None: no log-probabilities; K: each token's and K alternatives
    score_prompt: bool = False  # run the prompt through scored prefill (prompt scores)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), added to logits on the device
    pinned_seed: bool = False  # the seed was chosen: a sampled request never speculates (RequestSpec)

    @property
    def has_host_stops(self) -> bool:
        return bool(self.stop_strings or self.stop_token_sequences)

    def request_spec(self, request_id: str, prompt_ids: tuple[int, ...], **scheduling) -> RequestSpec:
        """The scheduler's `RequestSpec` (priority, snapshot and cache options pass through)."""
        return RequestSpec(
            request_id=request_id,
            prompt_ids=tuple(prompt_ids),
            max_output_tokens=self.max_output_tokens,
            eos_ids=frozenset(self.eos_token_ids),
            constrained=self.is_constrained,
            stop_strings=self.stop_strings,
            stop_token_sequences=self.stop_token_sequences,
            observe=self.is_timed,
            top_logprobs=self.top_logprobs,
            score_prompt=self.score_prompt,
            sampling=self.sampling,
            logit_bias=self.logit_bias,
            pinned_seed=self.pinned_seed,
            **scheduling,
        )
