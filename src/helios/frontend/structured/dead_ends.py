"""The compile check's walk through a grammar's first outputs, and its search past dead ends.

A dead end is a state where no token can follow and the output is not complete (llguidance's
``NoExtension`` error: an empty class such as ``[^\\s\\S]``, a rule that never ends, text the
vocabulary cannot spell). A grammar may hold one in a branch and still be satisfiable through
another (Lark ``start: "a" /[^\\s\\S]/ | "b"``), so the check must not refuse a grammar because the
first output it tries dead-ends.

`walk` is that check: a depth-first search over token paths from the answer's start. It first walks
the lowest allowed ids, as the check always did (`walk_masks` masks: a limit llguidance meets there
refuses the grammar). When a path dead-ends it backs up and tries the next allowed token (after a
token refused at a mask, the matcher is rebuilt from the start and the path replayed: llguidance's
error state is sticky; a state left without error is rolled back). It refuses a grammar only when
every path it explored dead-ended and the paths it explored are all there are; it passes it when the
walk of the lowest ids took its tokens without meeting a dead end (as the check always passed it),
when a path reaches a complete answer, or when the shared `SearchBudget` runs out first. A dead end
the check passes (a branch it did not explore, or one deeper than its walk) is ended cleanly at run
time: finish_reason ``grammar_dead_end`` (`helios.runtime.feedback`). A limit llguidance meets off
the lowest ids' walk refuses nothing and makes the search inconclusive.

One limit is a dead end in disguise (`is_endless`): where the only text that can follow a token is
forced and never ends (``("a")* /[^\\s\\S]/`` after "a": only "a" can follow, for ever), llguidance
forces byte after byte until its parser's items run out ("Too many items ...; ff_tokens") instead of
finding the dead end. The search treats it as a dead end it met (on the lowest ids' walk too, where
another limit refuses the grammar), except that when every output it explored, all there are, ends
in one or the other and one was that limit, the grammar is refused for the limit, as it was before.
So ``start: "d" | ("a")* /[^\\s\\S]/`` is served (its output "d" completes); a sampled output that
takes the endless branch ends at run time with finish_reason ``grammar_limit`` and its text so far.

Which tokens a state branches to (`branch_ids`): every allowed id but EOS, except that on a vocabulary
with a plain token for each byte UTF-8 text can hold, the allowed ids that start with one byte are
covered by that byte's own token (llguidance works on bytes: whatever follows a longer token follows
its first byte too, spelled byte by byte), unless the grammar counts tokens (``max_tokens``), where
token boundaries matter. Special tokens always branch on their own. So where the search ends without
running out of masks, it has explored every output the grammar allows.

Cost: one mask per state expanded; a check computes at most ``walk_masks`` masks per grammar it walks
plus the masks its `SearchBudget` holds, whatever the grammars (`GrammarCompiler` states the bound
of a whole check). A token the matcher refuses when it is consumed (a limit met off the lowest ids'
walk, an unknown-word token) takes one from the budget too: it costs a rebuilt matcher, as a mask
does, and no mask follows it (uncounted, a search tried every allowed token of each state it
reached). A state's other tokens are listed only when the search first backs up to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import llguidance
import numpy as np

# llguidance's error when a mask allows no token and the grammar is not complete.
DEAD_END = "NoExtension"
# llguidance's error for a token its own mask allowed but its parser refused (a token it cannot
# spell, such as an unknown-word token): for the search, a dead end like the other.
REFUSED_TOKEN = "doesn't satisfy the grammar"
# llguidance's parser error when a step's Earley items run out, and where: forcing the text after a
# token ("parser error: Too many items (limit 50000; ff_tokens); ...").
ENDLESS_ITEMS, ENDLESS_WHERE = "Too many items", "ff_tokens"


# Allowed special tokens (EOS aside) `first_token_limit` tries at the answer's start.
FIRST_TOKEN_SPECIALS = 64


# Bytes no UTF-8 text holds (llguidance's grammars are over text): a vocabulary may lack them
# (llguidance reserves 0xFF to mark special tokens).
_NEVER_IN_UTF8 = frozenset([0xC0, 0xC1, *range(0xF5, 0x100)])


def is_dead_end(error: str) -> bool:
    """Whether a matcher's error is a dead end (``NoExtension`` or ``NoExtensionBias``)."""
    return error.startswith(DEAD_END)


def is_endless(error: str) -> bool:
    """Whether a matcher's error is its parser's item limit met forcing the text after a token (see
    the module docstring: forced text that never ends, a dead end llguidance meets as a limit)."""
    first = error.split("\n", 1)[0]
    return ENDLESS_ITEMS in first and ENDLESS_WHERE in first


class SearchBudget:
    """Masks one check may compute past the walks of the lowest ids, shared by all its grammars
    (a token refused when consumed counts as one). Used by one thread (the check's)."""

    def __init__(self, masks: int):
        self.masks = masks

    def take(self) -> bool:
        """Spends one mask; False (spending nothing) when none is left."""
        if self.masks <= 0:
            return False
        self.masks -= 1
        return True


@dataclass(frozen=True)
class BranchVocabulary:
    """What `branch_ids` needs of a sampled vocabulary (read-only; built once per compiler).
    `first_bytes`: int16 [V], the first byte of each plain token's spelling (-1 for special or empty
    tokens); `byte_ids`: int64 [256], the plain one-byte token of each byte (-1 for a byte UTF-8
    text never holds and the vocabulary has no token for), or None when a byte of UTF-8 text has none
    (then nothing is covered)."""

    eos_ids: frozenset[int]
    first_bytes: np.ndarray
    byte_ids: np.ndarray | None

    @classmethod
    def of(cls, tokenizer: llguidance.LLTokenizer, vocab_size: int) -> BranchVocabulary:
        first_bytes = np.full(vocab_size, -1, dtype=np.int16)
        byte_ids = np.full(256, -1, dtype=np.int64)
        for token_id in range(vocab_size):
            if tokenizer.is_special_token(token_id):
                continue
            spelled = tokenizer.decode_bytes([token_id])
            if spelled:
                first_bytes[token_id] = spelled[0]
                if len(spelled) == 1 and byte_ids[spelled[0]] < 0:
                    byte_ids[spelled[0]] = token_id
        spells_text = all(byte_ids[byte] >= 0 for byte in range(256) if byte not in _NEVER_IN_UTF8)
        return cls(frozenset(tokenizer.eos_tokens), first_bytes, byte_ids if spells_text else None)


def allowed_ids(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The ids a mask row allows, ascending (only its nonzero words are unpacked)."""
    words = np.flatnonzero(mask)
    bits = np.unpackbits(mask[words].view(np.uint8).reshape(-1, 4), axis=1, bitorder="little")
    rows, columns = np.nonzero(bits)
    ids = words[rows] * 32 + columns
    return ids[ids < vocab_size]


def lowest_allowed(mask: np.ndarray, skip: frozenset[int]) -> int | None:
    """The lowest id a mask row allows that is not in `skip` (None when there is none)."""
    for word_index in np.flatnonzero(mask):
        word = int(mask[word_index]) & 0xFFFFFFFF
        while word:
            low = word & -word
            token_id = 32 * int(word_index) + low.bit_length() - 1
            if token_id not in skip:
                return token_id
            word ^= low
    return None


def branch_ids(mask: np.ndarray, vocabulary: BranchVocabulary, by_bytes: bool) -> list[int]:
    """The tokens a state branches to (see the module docstring), ascending, EOS left out."""
    allowed = allowed_ids(mask, len(vocabulary.first_bytes))
    allowed = allowed[~np.isin(allowed, list(vocabulary.eos_ids))]
    if by_bytes and vocabulary.byte_ids is not None and allowed.size:
        first = vocabulary.first_bytes[allowed]
        own = vocabulary.byte_ids[np.maximum(first, 0)]  # the own token of each one's first byte
        covered = (first >= 0) & (own >= 0) & np.isin(own, allowed)
        allowed = np.union1d(allowed[~covered], own[covered])
    return allowed.tolist()


class WalkResult(NamedTuple):
    """The check's verdict on one grammar: `error` is "" when it passes, else llguidance's error;
    `dead_end` when every output explored (all there are) dead-ended."""

    error: str = ""
    dead_end: bool = False


class _Path:
    """A matcher and the tokens it consumed from the walk's start (which it can be rebuilt from)."""

    def __init__(self, start: llguidance.LLMatcher):
        self._start = start
        self.matcher = start.deep_copy()
        self.ids: list[int] = []

    def rebuild(self) -> None:
        """After an error (sticky in llguidance): a fresh copy of the start with the path replayed."""
        self.matcher = self._start.deep_copy()
        if self.ids:
            self.matcher.consume_tokens(self.ids)

    def back(self) -> None:
        self.ids.pop()
        if self.matcher.is_error() or not self.matcher.rollback(1):
            self.rebuild()


class _Level:
    """One state on the path: its mask, and the tokens still to try there (listed when the walk
    first backs up to it: the walk of the lowest ids needs only the lowest)."""

    __slots__ = ("mask", "tried", "rest")

    def __init__(self, mask: np.ndarray, tried: int):
        self.mask, self.tried = mask.copy(), tried
        self.rest: list[int] | None = None


def walk(start: llguidance.LLMatcher, mask_words: int, eos_ids: frozenset[int],
         vocabulary: Callable[[], BranchVocabulary], *, walk_masks: int, budget: SearchBudget,
         by_bytes: bool) -> WalkResult:
    """The verdict on the grammar `start` is at (the answer's start; `start` is not changed): see
    the module docstring. Computes at most `walk_masks` masks plus what it takes from `budget`;
    `vocabulary` is called only once the walk backs up."""
    path, mask = _Path(start), np.empty(mask_words, dtype=np.int32)
    stack: list[_Level] = []  # stack[i]: the state after path.ids[:i]
    masks, live, dead, exhaustive, lowest = 0, False, False, True, True
    endless = ""  # the first endless limit met (`is_endless`): the verdict's error if nothing completes
    token_id: int | None = None  # the token to consume next (None: expand the state the path is at)
    while True:
        if token_id is not None:
            if path.matcher.consume_token(token_id) and not path.matcher.is_error():
                path.ids.append(token_id)
                token_id = None
                if lowest and len(path.ids) == walk_masks:
                    return WalkResult()  # the lowest ids' walk met no dead end: the check's pass
                continue
            error = path.matcher.get_error()
            refused = is_dead_end(error) or REFUSED_TOKEN in error
            endless = endless or (error if is_endless(error) else "")
            if lowest and not (refused or is_endless(error)):
                return WalkResult(error)  # a limit on the walk the check always made
            if not budget.take():  # a refused token costs a rebuilt matcher, as a state's mask does
                return WalkResult()
            dead, exhaustive = dead or refused, exhaustive and (refused or is_endless(error))
            path.rebuild()  # the state before the token
        else:
            if masks >= walk_masks and not budget.take():
                return WalkResult()  # out of masks without a verdict: pass
            masks += 1
            path.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            error = path.matcher.get_error() if path.matcher.is_error() else ""
            endless = endless or (error if is_endless(error) else "")
            if error and lowest and not (is_dead_end(error) or is_endless(error)):
                return WalkResult(error)
            first = None if error else lowest_allowed(mask, eos_ids)
            live = live or (not error and path.matcher.is_accepting())
            dead = dead or is_dead_end(error)
            exhaustive = exhaustive and (not error or is_dead_end(error) or is_endless(error))
            if live and not (lowest and first is not None):
                return WalkResult()  # a complete answer (after the lowest ids' walk, when on it)
            if first is not None:
                stack.append(_Level(mask, first))
                token_id = first
                continue
            if path.ids:
                path.back()  # this state is a dead end (or complete): its parent tries its next token
        lowest = False
        if live:
            return WalkResult()
        token_id = _next(stack, path, vocabulary, by_bytes)
        if token_id is None:
            return _verdict(live, dead, exhaustive, endless)


def _next(stack: list[_Level], path: _Path, vocabulary: Callable[[], BranchVocabulary], by_bytes: bool) -> int | None:
    """The next token to try (the path backed up to its parent state), None when none is left."""
    while stack:
        level = stack[-1]
        if level.rest is None:
            level.rest = [t for t in reversed(branch_ids(level.mask, vocabulary(), by_bytes)) if t != level.tried]
        if level.rest:
            return level.rest.pop()
        stack.pop()
        if path.ids:
            path.back()
    return None


def first_token_limit(start: llguidance.LLMatcher, mask_words: int, vocabulary: Callable[[], BranchVocabulary]) -> str:
    """llguidance's error for the first of the answer's first tokens that meets a limit when it is
    consumed, "" when none does (`start` is the answer's start and is not changed). The walk takes
    only the lowest ids, but a sampled output may start with any allowed token: ``[`` can open more
    parser items than a row holds where a digit opens few (128 self-referencing array alternatives).
    One token per first byte is tried (the lowest allowed id spelled from it, a plain token, so at
    most 256) and each allowed special token but EOS, at most `FIRST_TOKEN_SPECIALS`: a limit met
    deeper, or by a longer token than its byte's, is left to the runtime backstop. A dead end, a
    refused token or endless forced text is the walk's business, not a limit here."""
    mask = np.empty(mask_words, dtype=np.int32)
    probe = start.deep_copy()
    probe.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
    if probe.is_error():
        return ""  # the walk met it at the same mask
    known = vocabulary()
    allowed = allowed_ids(mask, len(known.first_bytes))
    allowed = allowed[~np.isin(allowed, list(known.eos_ids))]
    first = known.first_bytes[allowed]
    plain = allowed[first >= 0]
    _, lowest = np.unique(first[first >= 0], return_index=True)  # allowed is ascending: the lowest of each byte
    for token_id in [*plain[lowest].tolist(), *allowed[first < 0][:FIRST_TOKEN_SPECIALS].tolist()]:
        probe = start.deep_copy()
        if probe.consume_token(token_id) and not probe.is_error():
            continue
        error = probe.get_error()
        if not (is_dead_end(error) or REFUSED_TOKEN in error or is_endless(error)):
            return error
    return ""


def _verdict(live: bool, dead: bool, exhaustive: bool, endless: str) -> WalkResult:
    if exhaustive and not live and endless:
        return WalkResult(endless)  # refused for the limit llguidance met, as the lowest ids' walk was
    if dead and exhaustive and not live:
        return WalkResult(DEAD_END, dead_end=True)
    return WalkResult()
