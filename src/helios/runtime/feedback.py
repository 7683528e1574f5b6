"""Host feedback the model worker needs before a lane's next token: grammar masks and host stops.

A constrained request's grammar matcher is handed to the engine at submission and from then on
belongs to the model worker alone (next to the scheduler): the worker fills the lane's mask row
before each sampled token (`fill_masks`) and advances the matcher with every token it generates
(`advance`), before the scheduler plans the lane again. Nothing in the server or the frontend is
called for it on the worker thread.

A matcher never raises on its own: on a grammar or token error it enters a sticky error state whose
mask allows only EOS. Neither kind of error below may put a token the grammar did not take into the
output: the error mask's EOS is one the model did not choose, and a token the matcher refused is one
the grammar did not take.

A limit: llguidance refuses to go on past the output (its lexer's state or expression limits, its
parser's "Too many items" in a row or a step, its fuel; or a token its mask allowed that its parser
then refused, such as an unknown-word token). It shows at a mask (`fill_masks` notes the request in
`limits`; the engine ends it right after launching the plan, so the row's forced token is dropped at
completion) or when a token is consumed (`TensorGrammar.consume_token` raises `GrammarFailure`;
`advance` reports it in `Advance.failure`, and the engine delivers only the ids before that token).
The request ends with GRAMMAR_LIMIT and its output so far, every token the grammar took
(finish_reason ``grammar_limit``, HTTP 200, or a stream's final chunk and ``[DONE]``). Met before any
output token, it ends with ERROR instead, its message naming the limit (`grammar_limit_message`:
HTTP 500 ``execution_error``, or one ``event: error`` in a stream): an empty answer that ends as if
normally would hide why (the compile check refuses, with a 400, a grammar whose first masks meet a
limit, so this is a limit the check did not see). The limit's text is the finish's message either
way. Only that request ends: the rows beside it in the plan, the other choices of its response
(``n``) and the requests after it run on.

A dead end is different: the grammar is fine but allows no token after the output, which is not
complete (a branch that can never finish, which the compile check passed because another branch
can; or one deeper than the check looks). The matcher enters its error state at that mask, and the
EOS its mask then allows would be a token the model did not choose, reported as a normal stop.
`fill_masks` notes such requests (`dead_ends`); the engine ends each one with GRAMMAR_DEAD_END right
after launching the plan (`Scheduler.dead_end`), so the row's forced token is dropped at completion
and the output is the text so far (finish_reason ``grammar_dead_end``, HTTP 200).

A runtime-side host stop (`EngineRequest.host_stop`, a callable on token ids for in-process
callers that resolve stops within the frame) runs in `advance` too. Stop strings of served
requests are matched by the frontend's output workers instead, off the worker thread, and come back
as a stop-matched command (`Engine.stop_matched`).
"""

from __future__ import annotations

from typing import Callable, Iterable, NamedTuple, Protocol, Sequence

import numpy as np
import torch

from helios.errors import ExecutionError

MAX_GRAMMAR_ERROR_CHARS = 240


class GrammarFailure(ExecutionError):
    """A request's grammar matcher entered its error state when it consumed a token (for example
    llguidance's lexer limits reached deep in the output): the grammar did not take that token.
    `reason` (also the message) is llguidance's error, bounded (`limit_reason`); `LaneFeedback.advance`
    turns it into `Advance.failure`, and the client reads it as the request's finish message."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Advance(NamedTuple):
    """What `LaneFeedback.advance` made of a token event's ids, when not all of them simply went
    through: the first `num_taken` were taken; then either the host stop matched at the last of them
    (`is_stopped`) or the grammar refused the next one (`failure`: llguidance's error, bounded)."""

    num_taken: int
    is_stopped: bool = False
    failure: str = ""


class GrammarState(Protocol):
    """The per-request grammar matcher the worker owns once submitted."""

    def fill_bitmask(self, row: torch.Tensor) -> None: ...

    def consume_token(self, token_id: int) -> object: ...


class ArrayMaskGrammar(Protocol):
    """A matcher that writes mask rows into int32 numpy arrays (llguidance-style), with a sticky
    error state instead of exceptions."""

    def fill_bitmask(self, out: np.ndarray) -> None: ...

    def consume_token(self, token_id: int) -> object: ...

    @property
    def is_error(self) -> bool: ...

    @property
    def error(self) -> str: ...

    @property
    def is_dead_end(self) -> bool:
        """In the error state because no token can follow the output, which is not complete."""
        ...


class TensorGrammar:
    """Adapts a matcher writing numpy mask rows to the engine's `GrammarState` (torch rows); the
    row is a CPU tensor the engine allocates, so `numpy()` shares its memory. Raises
    `GrammarFailure` from `consume_token` once the matcher is in its error state."""

    __slots__ = ("_matcher",)

    def __init__(self, matcher: ArrayMaskGrammar):
        self._matcher = matcher

    def fill_bitmask(self, row: torch.Tensor) -> None:
        self._matcher.fill_bitmask(row.numpy())

    def consume_token(self, token_id: int) -> object:
        accepted = self._matcher.consume_token(token_id)
        if self._matcher.is_error:
            raise GrammarFailure(limit_reason(self._matcher.error))
        return accepted

    @property
    def is_dead_end(self) -> bool:
        """Whether the last mask met a dead end (a matcher that cannot tell never does)."""
        return bool(getattr(self._matcher, "is_dead_end", False))

    @property
    def limit(self) -> str:
        """llguidance's error (bounded, `limit_reason`) when the matcher is in its error state for a
        reason other than a dead end, else "" (a matcher that cannot tell never is)."""
        if not getattr(self._matcher, "is_error", False) or self.is_dead_end:
            return ""
        return limit_reason(self._matcher.error)

    @property
    def source(self) -> str | None:
        """The matcher's grammar text, when it has one (what an engine process compiles again)."""
        return getattr(self._matcher, "source", None)


class LaneFeedback:
    """The worker's per-request feedback hooks (grammar matchers, runtime host stops), by request id.
    Used by the model worker thread only."""

    def __init__(self, mask_words: int):
        self._mask_words = mask_words
        self._grammars: dict[str, GrammarState] = {}
        self._host_stops: dict[str, Callable[[int], bool]] = {}
        self.dead_ends: list[str] = []  # requests whose last `fill_masks` met a dead end
        self.limits: dict[str, str] = {}  # requests whose last `fill_masks` met a limit: its reason
        self.failures: dict[str, Exception] = {}  # requests whose grammar raised in the last `fill_masks`

    def register(self, request_id: str, grammar: GrammarState | None,
                 host_stop: Callable[[int], bool] | None) -> None:
        if grammar is not None:
            self._grammars[request_id] = grammar
        if host_stop is not None:
            self._host_stops[request_id] = host_stop

    def forget(self, request_id: str) -> None:
        self._grammars.pop(request_id, None)
        self._host_stops.pop(request_id, None)

    @property
    def watching(self) -> bool:
        """Whether any request has a grammar or a host stop (else `advance` never matches or feeds)."""
        return bool(self._grammars or self._host_stops)

    def fill_masks(self, rows: Iterable) -> dict[str, torch.Tensor]:
        """Mask rows of the plan rows that sample under a grammar; `dead_ends` then lists the requests
        whose grammar met a dead end at its mask, `limits` those whose grammar met a limit there
        (with llguidance's reason), and `failures` those whose grammar raised (a matcher's fault:
        that request alone fails, its row allowing every token, the token dropped as it ends; a plan
        failed for it ended every request beside it too)."""
        self.dead_ends, self.limits, self.failures = [], {}, {}
        if not self._grammars:  # no row has a grammar to fill from
            return {}
        masks = {}
        for row in rows:
            grammar = self._grammars.get(row.request_id) if row.constrained and row.samples else None
            if grammar is not None:
                mask = torch.empty(self._mask_words, dtype=torch.int32)
                masks[row.request_id] = mask
                try:
                    grammar.fill_bitmask(mask)
                    if getattr(grammar, "is_dead_end", False):
                        self.dead_ends.append(row.request_id)
                    elif getattr(grammar, "limit", ""):
                        self.limits[row.request_id] = grammar.limit
                except Exception as error:  # noqa: BLE001 - this request's matcher failed, not the plan
                    mask.fill_(-1)
                    self.failures[row.request_id] = error
        return masks

    def advance(self, request_id: str, token_ids: Sequence[int]) -> Advance | None:
        """Feeds generated ids to the request's grammar and host stop, in order, before they are
        delivered; None when every id was taken and no host stop matched, else how far they went
        (`Advance`: the ids after a host stop's match, or from the id the grammar refused on, are
        not fed). Raises what a hook raises, but for the grammar's `GrammarFailure`."""
        grammar = self._grammars.get(request_id)
        host_stop = self._host_stops.get(request_id)
        if grammar is None and host_stop is None:
            return None
        for index, token_id in enumerate(token_ids):
            if grammar is not None:
                try:
                    grammar.consume_token(token_id)
                except GrammarFailure as failure:
                    return Advance(index, failure=failure.reason)
            if host_stop is not None and host_stop(token_id):
                return Advance(index + 1, is_stopped=True)
        return None


def limit_reason(error: str) -> str:
    """llguidance's error as a client may read it: its first line (never its state dump), bounded."""
    lines = error.strip().splitlines()
    reason = lines[0] if lines else "unknown error"
    if len(reason) > MAX_GRAMMAR_ERROR_CHARS:
        reason = reason[:MAX_GRAMMAR_ERROR_CHARS] + "..."
    return reason


def grammar_limit_message(reason: str) -> str:
    """The error of a request whose grammar met a limit before any output token (see the module
    docstring); `reason` is `limit_reason`'s, which names the limit."""
    return f"the output grammar exceeded llguidance's limits before any output: {reason}"
