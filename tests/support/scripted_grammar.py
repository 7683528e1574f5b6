"""Grammar matchers that go wrong on cue, following llguidance's contract (never raise; a sticky
error state whose mask allows only EOS), and the engine run the grammar-failure tests share: one
constrained request beside a plain one.

`ScriptedMatcher` allows every token (EOS too, unless `allows_eos` is off) until `num_fine` were
consumed, then enters its error state with `error` (llguidance's text: a limit, or ``NoExtension...``
for a dead end) at the next token (`on_fill` False: that token is refused) or at the mask after them
(`on_fill` True).
"""

from __future__ import annotations

import numpy as np

from helios.runtime.engine import EngineRequest
from helios.runtime.feedback import TensorGrammar
from helios.runtime.records.events import TokenEvent
from helios.runtime.records.request import RequestSpec

PROMPT = (5, 9, 14, 3, 22, 7)
EOS = 2
EOS_ONLY = np.int32(1 << (EOS % 32))  # the word of EOS in the error state's mask


class ScriptedMatcher:
    """See the module docstring. `consumed`: the tokens it took; `num_masks`: masks it filled."""

    def __init__(self, num_fine: int, error: str, on_fill: bool = False, allows_eos: bool = True):
        self.num_fine, self.on_fill, self.allows_eos = num_fine, on_fill, allows_eos
        self._error_text = error
        self.consumed: list[int] = []
        self.error = ""
        self.num_masks = 0

    @property
    def is_error(self) -> bool:
        return bool(self.error)

    @property
    def is_dead_end(self) -> bool:
        return self.error.startswith("NoExtension")

    def fill_bitmask(self, out: np.ndarray) -> None:
        self.num_masks += 1
        if self.on_fill and len(self.consumed) >= self.num_fine:
            self.error = self._error_text
        out[:] = -1
        if self.error:
            out[:] = 0
            out[EOS // 32] = EOS_ONLY
        elif not self.allows_eos:
            out[EOS // 32] = ~EOS_ONLY

    def consume_token(self, token_id: int) -> bool:
        if self.error:
            return False
        self.consumed.append(token_id)
        if not self.on_fill and len(self.consumed) > self.num_fine:
            self.error = self._error_text
            return False
        return True


def run_beside(engine, matcher, max_tokens: int = 8) -> tuple[list, list]:
    """The events of a constrained request ("g", under `matcher`) and of a plain one beside it ("b"),
    both `max_tokens` long at most, once the engine is idle."""
    grammar, beside = [], []
    engine.submit(EngineRequest(RequestSpec("g", PROMPT, max_tokens, frozenset({EOS}), constrained=True),
                                grammar.append, grammar=TensorGrammar(matcher)))
    engine.submit(EngineRequest(RequestSpec("b", PROMPT, max_tokens), beside.append))
    engine.run_until_idle()
    return grammar, beside


def tokens_of(events) -> list[int]:
    """The token ids of `events`, in order."""
    return [t for e in events if isinstance(e, TokenEvent) for t in e.token_ids]
