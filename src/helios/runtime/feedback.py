"""Host feedback the model worker needs before a lane's next token: grammar masks and host stops.

A constrained request's grammar matcher is handed to the engine at submission and from then on
belongs to the model worker alone (next to the scheduler): the worker fills the lane's mask row
before each sampled token (`fill_masks`) and advances the matcher with every token it generates
(`advance`), before the scheduler plans the lane again. Nothing in the server or the frontend is
called for it on the worker thread.

A matcher never raises on its own: on a grammar or token error (a lexer limit reached deep in the
output, a token it forbids) it enters a sticky error state whose mask allows only EOS. `TensorGrammar`
reads that state after every token it consumes and raises `GrammarFailure`, so the engine ends the
request with an ERROR finish (HTTP 500, or one `event: error` in a stream) instead of a normal stop.
A mask filled in the error state allows only EOS: the EOS the lane then samples is consumed next
and reported there, so no other request in the plan is touched.

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

from typing import Callable, Iterable, Protocol

import numpy as np
import torch

from helios.errors import ExecutionError

MAX_GRAMMAR_ERROR_CHARS = 240


class GrammarFailure(ExecutionError):
    """A request's grammar matcher entered its error state while decoding (for example llguidance's
    lexer limits reached deep in the output): the output no longer follows the grammar, so the
    request ends in error. The message is worded for the client."""


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
            raise GrammarFailure(grammar_failure_message(self._matcher.error))
        return accepted

    @property
    def is_dead_end(self) -> bool:
        """Whether the last mask met a dead end (a matcher that cannot tell never does)."""
        return bool(getattr(self._matcher, "is_dead_end", False))

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
        """Mask rows of the plan rows that sample under a grammar (a grammar that raises fails the
        plan); `dead_ends` then lists the requests whose grammar met a dead end at its mask."""
        self.dead_ends = []
        if not self._grammars:  # no row has a grammar to fill from
            return {}
        masks = {}
        for row in rows:
            grammar = self._grammars.get(row.request_id) if row.constrained and row.samples else None
            if grammar is not None:
                mask = torch.empty(self._mask_words, dtype=torch.int32)
                grammar.fill_bitmask(mask)
                masks[row.request_id] = mask
                if getattr(grammar, "is_dead_end", False):
                    self.dead_ends.append(row.request_id)
        return masks

    def advance(self, request_id: str, token_ids: Iterable[int]) -> bool:
        """Feeds generated ids to the request's grammar and host stop, in order; True when the host
        stop matched (the ids after it are not fed). Raises what a hook raises."""
        grammar = self._grammars.get(request_id)
        host_stop = self._host_stops.get(request_id)
        if grammar is None and host_stop is None:
            return False
        for token_id in token_ids:
            if grammar is not None:
                grammar.consume_token(token_id)
            if host_stop is not None and host_stop(token_id):
                return True
        return False


def grammar_failure_message(error: str) -> str:
    """What a client reads when its output grammar failed mid-output: llguidance's first line, bounded."""
    lines = error.strip().splitlines()
    reason = lines[0] if lines else "unknown error"
    if len(reason) > MAX_GRAMMAR_ERROR_CHARS:
        reason = reason[:MAX_GRAMMAR_ERROR_CHARS] + "..."
    return ("the output grammar failed during decoding (it exceeded llguidance's limits or met a token "
            f"it forbids): {reason}")
