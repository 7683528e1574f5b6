"""Per-request records: the immutable prepared request, the scheduler's mutable state, views.

`RequestSpec` is what the engine submits (already tokenized and validated by the frontend).
`RequestState` is the one mutable object per request; only the scheduler mutates it. Everyone
else reads `RequestView`s. There is no prefill or decode phase: the state is counters, and each
step computes tokens until `num_computed_tokens` catches up with the tokens the request has.

Counters (all in tokens, positions start at 0):
- `token_ids`: prompt followed by the outputs the host knows.
- `num_computed_tokens`: committed history (validated by completion) - the consumed endpoint.
- `num_inflight_tokens`: history positions scheduled in plans not yet completed.
- `num_pending_samples`: in-flight rows that will produce output tokens the host does not know.
The request still needs `len(token_ids) + num_pending_samples - frontier` tokens computed, where
`frontier = num_computed_tokens + num_inflight_tokens`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from helios.runtime.records.events import FinishReason
from helios.runtime.records.sampling_params import GREEDY, SamplingParams

RELEASED_PAGE = -1  # a page_ids entry whose page was released (outside the sliding window); never read


@dataclass(frozen=True)
class RequestSpec:
    """A prepared request. `priority`: lower is more important (0 default).

    `constrained` requests need a host grammar mask before every sampled token; requests with
    stop strings or stop token sequences (`has_host_stops`) need the host to resolve matches
    after every round. Both therefore run with one outstanding round and width one.
    `observe` asks for token timestamps. `publish_snapshot` asks to checkpoint the final
    committed state for later requests (multi-turn reuse). `score_prompt` runs the prompt
    through scored prefill (no prefix reuse). `cache_salt` separates prefix-cache namespaces.
    `top_logprobs` (None: none) asks for every sampled token's log-probability and that many
    most probable alternatives: its steps run token-logprobs programs (speculative ones only where
    every SPECULATIVE program has a token-logprobs twin; else it never speculates).
    `sampling` holds its sampling parameters and seed; `logit_bias` (token id, bias) pairs with
    distinct ids are added to its logits on the device (speculative programs add them to the draft's
    and the target's logits; on a core prepared before they did, a request with a bias decodes
    plainly). `stable_prefix_len`: prompt tokens that later
    turns of the same conversation render identically (the frontend's prefix-boundary rules; 0:
    none known); where snapshots are the only prefix reuse, the prompt's state is published there
    too, so the next turn restores it. `pinned_seed`: its seed was chosen (the request's, or a
    fixed seed policy's), so a sampled request runs at width one (`single_lane`): each token is the
    plain draw at its position, whatever speculative rounds the requests beside it make (verifying a
    drafted run couples its draws to where the rounds fall).

    This is the one record of what a request asks for: the scheduler keeps it in the request's
    `RequestState`, a plan carries it once to the packers (`StepPlan.admitted`, the tensor-parallel
    peers' included), and the engine reads it from there; nothing restates its values.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    max_output_tokens: int
    eos_ids: frozenset[int] = frozenset()
    priority: int = 0
    constrained: bool = False
    stop_strings: tuple[str, ...] = ()
    stop_token_sequences: tuple[tuple[int, ...], ...] = ()
    observe: bool = False
    publish_snapshot: bool = False
    score_prompt: bool = False
    cache_salt: bytes = b""
    top_logprobs: int | None = None
    sampling: SamplingParams = GREEDY
    logit_bias: tuple[tuple[int, float], ...] = ()
    stable_prefix_len: int = 0
    pinned_seed: bool = False
    # (prompt index, key) pairs the prefix cache digests instead of the token id there: image
    # feature tokens keyed by their image's content hash.
    token_keys: tuple[tuple[int, int], ...] = ()
    # The request's `helios.runtime.images.RequestImages` (None: text only); in-process only.
    images: object = field(default=None, compare=False, repr=False)

    @property
    def has_logit_bias(self) -> bool:
        return bool(self.logit_bias)

    @cached_property
    def has_host_stops(self) -> bool:
        return bool(self.stop_strings or self.stop_token_sequences)

    @cached_property
    def needs_feedback(self) -> bool:
        """Each round waits for the host to see the previous one (grammar, host stops)."""
        return self.constrained or self.has_host_stops

    @cached_property
    def single_lane(self) -> bool:
        """Each round holds one token of it: it needs feedback, or samples with a pinned seed."""
        return self.needs_feedback or (self.pinned_seed and not self.sampling.is_greedy)


class RequestStatus(enum.IntEnum):
    WAITING = 1  # queued for (re)admission; holds no slot and no pages (maybe a private snapshot)
    RUNNING = 2  # holds a slot and pages
    FINISHED = 3  # terminal event emitted; resources released once no plan in flight names it


@dataclass(eq=False, slots=True)
class RequestState:
    """The scheduler's mutable record of one request. Never handed out: see `RequestView`."""

    spec: RequestSpec
    arrival: int  # submission order, the tie-breaker of every ordering
    root: bytes  # chain root digest (cache identity + salt)
    token_ids: list[int]
    status: RequestStatus = RequestStatus.WAITING
    num_computed_tokens: int = 0
    num_inflight_tokens: int = 0
    num_pending_samples: int = 0
    num_inflight_plans: int = 0
    slot: int = -1
    generation: int = 0
    page_ids: list[int] = field(default_factory=list)
    num_uploaded_pages: int = 0
    num_published_pages: int = 0
    num_released_pages: int = 0  # leading page_ids released outside the sliding window (now RELEASED_PAGE)
    # The table of the layout's window region (its own page ids, same length as page_ids), if any:
    # leading entries released outside the window, and entries published to its prefix cache.
    window_ids: list[int] = field(default_factory=list)
    num_window_released: int = 0
    num_window_published: int = 0
    chain: list[bytes] = field(default_factory=list)  # digests of complete pages of token_ids
    prompt_key: bytes = b""  # its prompt group's digest, once computed (`helios.runtime.cache.prompt_sharing`)
    snapshot_id: int = 0  # private snapshot while preempted (0: none)
    announced: bool = False  # a plan carried its spec to the packers (`StepPlan.admitted`)
    prompt_checkpointed: bool = False  # a snapshot of its prompt boundary was requested
    stable_checkpointed: bool = False  # a snapshot at its stable prefix's end was requested
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    num_reused_tokens: int = -1  # -1 until first admission
    num_preemptions: int = 0
    released: bool = False
    request_id: str = ""
    num_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        self.request_id = self.spec.request_id
        self.num_prompt_tokens = len(self.spec.prompt_ids)

    @property
    def stable_boundary(self) -> int:
        """Where a snapshot of the stable prefix is still to be published: its end when inside the
        prompt (short of the prompt boundary, which is published anyway) and not yet requested; else 0."""
        end = self.spec.stable_prefix_len
        return end if 0 < end < self.num_prompt_tokens and not self.stable_checkpointed else 0

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def frontier(self) -> int:
        return self.num_computed_tokens + self.num_inflight_tokens

    @property
    def num_tokens_ahead(self) -> int:
        """Tokens still to compute before the next sample (1 when only the pending token is left)."""
        return len(self.token_ids) + self.num_pending_samples - self.frontier

    @property
    def num_output_budget(self) -> int:
        """Output tokens it may still produce beyond those known or in flight."""
        return self.spec.max_output_tokens - self.num_output_tokens - self.num_pending_samples

    @property
    def order_key(self) -> tuple[int, int]:
        """Scheduling order: most important first, then first submitted."""
        return (self.spec.priority, self.arrival)

    def view(self) -> RequestView:
        return RequestView(
            self.request_id, self.status, self.finish_reason, self.num_prompt_tokens,
            tuple(self.token_ids[self.num_prompt_tokens:]), self.num_computed_tokens,
            max(self.num_reused_tokens, 0), self.num_preemptions, self.slot)


class RequestView(NamedTuple):
    """Read-only copy of a request's public state."""

    request_id: str
    status: RequestStatus
    finish_reason: FinishReason
    num_prompt_tokens: int
    output_ids: tuple[int, ...]
    num_computed_tokens: int
    num_reused_tokens: int
    num_preemptions: int
    slot: int
