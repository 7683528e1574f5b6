"""Incremental detokenization: generated token ids in, text deltas out.

One `IncrementalDetokenizer` serves one request's output and is used by one thread. It owns the ids
fed so far and two offsets into them (the window scheme of TGI and vLLM):

- text decoded from ``ids[prefix_offset:read_offset]`` has already been emitted;
- each feed decodes ``ids[prefix_offset:]`` and emits what lies beyond that emitted prefix, unless
  the decoded text ends in U+FFFD, which is how the tokenizer's lossy UTF-8 decoding spells an
  incomplete trailing character; such text stays pending until a later token completes it.

The window restarts at the last emission and skipped special tokens (which decode to nothing
anywhere) are left out of it, so each feed decodes only a few tokens; decoders that treat the first
token of a sequence specially (leading-space stripping) see the same first token in both decodes;
another id that adds no text (a SentencePiece ``▁`` first in the text) stays pending. A detokenizer may
start after context ids (a text completion's prompt, its last `CONTEXT_IDS`), already read: the
first output token then decodes as it does after them, so a SentencePiece ``▁`` word keeps the
leading space it has in the text rather than losing it as the first token of a sequence (context
ending inside a character is not used, nor a run of byte-fallback tokens it ends in where the output
starts with a byte token, which would join that run). Invariants: a delta never ends inside a UTF-8
character, emitted text is never emitted again, and the concatenation of every delta and `finish()` equals
``tokenizer.decode(all_ids, skip_special_tokens=...)`` (with context: what decoding the context and
all ids adds to the context's text).

A run of stray bytes (bytes that start no character, or start one cut short) keeps the decoded text
ending in U+FFFD, so its ids stay pending; decoding the whole growing window on each id would cost
quadratic time. Once the pending ids hold `SETTLE_IDS` more ids than that, the text of the older ones
is settled: the window decodes from the last `SETTLE_IDS` ids (the live window) and the text before
it is kept. A split is taken only where no later id can change the text before it: the whole window's
text ends with the live window's, which holds at least 4 characters (UTF-8 resynchronises within a
character's 4 bytes), and the live window's text still ends in U+FFFD without each of its last 3 ids
(so its open byte group is invalid wherever it ends, not a valid start with a character cut short: a
byte-fallback decoder spells an invalid group as one U+FFFD per byte however long it grows). Each id
is then decoded a bounded number of times.

A byte-fallback tokenizer (SentencePiece ``<0xNN>`` tokens, `tokenizers`' ByteFallback decoder) reads
a run of byte tokens as one group: valid UTF-8, its characters; otherwise one U+FFFD per byte, the
characters before any invalid byte included (``é`` then a stray ``0x80`` reads as three U+FFFD). A
later byte token can so change the text of every byte token before it in the run, so a run's text
stays pending until a token that is not a byte token ends it (or `finish`; a special token that
skipping removes does not end it); the whole decode is then the stream's text wherever the run is
split. There the U+FFFD test above does not tell that a group is invalid for good (a run open in the
middle of a character reads U+FFFD on every byte, and bytes spelling a literal U+FFFD read as one), so
a split inside a run is taken only where the open run and the live window's bytes both hold a UTF-8
error no later byte can mend (both then read U+FFFD per byte however the run grows). A run is not
decoded on each id, valid or not (its text shows only once a token ends it either way): it is decoded
when a token ends it (or `open_text` is read), so an invalid run growing by valid bytes costs linear time.

A core whose tokenizer cleans up tokenization spaces (transformers' ``clean_up_tokenization``, where
``tokenizer_config.json`` sets ``clean_up_tokenization_spaces`` and transformers applies it) passes the
deltas through `SpaceCleanup`: the concatenation of the deltas is then that cleanup of the whole decode
(" ." reads "."), a space that may start a cleaned pattern held back until the text after it decides.
"""

from __future__ import annotations

import bisect
import codecs
from typing import Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"
CONTEXT_IDS = 5  # context ids a detokenizer keeps (vLLM's initial offset): a few tokens of text before the output
SETTLE_IDS = 8  # ids a live window keeps when pending text is settled (it is tried at twice this many)
MIN_LIVE_CHARS = 4  # a UTF-8 character's most bytes: the live window's text holds at least this many characters


class Decoder(Protocol):
    """The part of `tokenizers.Tokenizer` that detokenization needs."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_to_id(self, token: str) -> int | None: ...

    def id_to_token(self, token_id: int) -> str | None: ...


# transformers' `clean_up_tokenization`, applied in this order, each replacement over the whole text
CLEANUP_REPLACEMENTS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                        (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization`` of a whole text (`SpaceCleanup` streams it)."""
    for old, new in CLEANUP_REPLACEMENTS:
        text = text.replace(old, new)
    return text


def cleaned_parts(parts: Sequence[str]) -> tuple[str, ...]:
    """`parts` of a text, each cleaned as `SpaceCleanup` streams them (text it holds back goes to a
    later part, the rest to the last): joined, they are `clean_up_tokenization` of the text."""
    cleanup = SpaceCleanup()
    cleaned = [cleanup.push(part) for part in parts]
    if cleaned:
        cleaned[-1] += cleanup.flush()
    return tuple(cleaned)


class SpaceCleanup:
    """Streams transformers' ``clean_up_tokenization``: the concatenation of `push` deltas and `flush`
    equals the cleanup of the concatenated input. The cleanup is a chain of ``str.replace`` calls, each
    over the previous one's whole output; each link here holds back the end of its input that may begin
    an occurrence (a proper prefix of its pattern, after its last replacement), which ``str.replace``'s
    left-to-right scan would take whole. A replacement keeps some characters of its pattern and
    removes the others (the leading space, and the last one of " ' "), so each output character is
    an input character: `num_removed` counts the removed ones (a text's offsets into the cleaned
    text), and `removed_before` the removed ones before a position once no later input changes
    them (each held character's position in the input is kept with it). Mutates only its own
    state; `copy` for a look-ahead."""

    def __init__(self, held: Sequence[str] = ("",) * len(CLEANUP_REPLACEMENTS)):
        self._held = list(held)  # per link: its input not yet passed on
        self._held_at: list[list[int]] = [list(range(len(text))) for text in held]  # their input positions
        self._removed_at: list[int] = []  # the input positions of the removed characters, ascending
        self._num_in = 0  # characters pushed
        self._num_out = 0  # characters passed on
        self.num_removed = 0  # see `push`
        self.num_carried = 0  # see `push`

    def copy(self) -> "SpaceCleanup":
        """A look-ahead: the same held text, positions counted from its start."""
        return SpaceCleanup(self._held)

    @property
    def num_pushed(self) -> int:
        """Characters pushed so far (the input position of the next push's text)."""
        return self._num_in

    def removed_before(self, position: int) -> int | None:
        """How many of the input's first `position` characters the cleanup removes, or None while
        it may still change (it holds one of them: the text after it decides)."""
        held = [at[0] for at in self._held_at if at]
        if held and position > min(held):
            return None
        return bisect.bisect_left(self._removed_at, position)

    def push(self, text: str) -> str:
        """The cleaned text that no later input changes. Sets `num_removed`: how many characters of
        the input before `text` the cleanup removes, as far as it knows (the text it holds read as
        if the input ended here, as `flush` would clean it); and `num_carried`: how many characters
        the output begins with that were pushed before `text` (held back until it came)."""
        num_before = 0  # characters at the start of the link's new input that were pushed before `text`
        tails = []  # per link: its held text and how many of its characters were pushed before `text`
        num_in, out = len(text), text
        out_at = list(range(self._num_in, self._num_in + num_in))
        for index, (old, new) in enumerate(CLEANUP_REPLACEMENTS):
            held = self._held[index]
            if out or held:
                link_in = held + out
                out, held, num_before, held_before = _replace_held(link_in, old, new, len(held) + num_before)
                out_at = self._track(index, link_in, out_at, len(held))
            else:
                held_before = 0
            self._held[index] = held
            tails.append((held, held_before))
        kept_at_end = _kept_at_end(tails) if any(held for held, _ in tails) else 0
        self.num_removed = self._num_in - self._num_out - num_before - kept_at_end
        self.num_carried = num_before
        self._num_in += num_in
        self._num_out += len(out)
        return out

    def flush(self) -> str:
        """The end of the input: every held text, cleaned."""
        text, text_at = "", []
        for index, (old, new) in enumerate(CLEANUP_REPLACEMENTS):
            text_at = self._track(index, self._held[index] + text, text_at, 0)
            text, self._held[index] = (self._held[index] + text).replace(old, new), ""
        self._num_out += len(text)
        return text

    def _track(self, index: int, text: str, new_at: list[int], num_held: int) -> list[int]:
        """Link `index` took `text` (its held text, then new input at positions `new_at`) and holds
        its last `num_held` characters: records the positions of the characters it removes (those
        of each occurrence of its pattern that the replacement drops) and of those it holds; returns
        the positions of those it passes on."""
        old, new = CLEANUP_REPLACEMENTS[index]
        text_at = self._held_at[index] + new_at
        kept_end = len(text) - num_held
        self._held_at[index] = text_at[kept_end:]
        found = text.find(old)
        if found < 0:
            return text_at[:kept_end]
        removed = set()
        while found >= 0:
            removed.add(found)
            removed.update(range(found + 1 + len(new), found + len(old)))
            found = text.find(old, found + len(old))
        for offset in removed:
            bisect.insort(self._removed_at, text_at[offset])
        return [position for offset, position in enumerate(text_at[:kept_end]) if offset not in removed]


def _kept_at_end(tails: Sequence[tuple[str, int]]) -> int:
    """How many characters pushed before the last push `flush` would keep: `tails` are the links'
    held texts, each with the number of its first characters that were pushed before it."""
    text, num_before = "", 0
    for (held, held_before), (old, new) in zip(tails, CLEANUP_REPLACEMENTS):
        boundary = held_before + (num_before if held_before == len(held) else 0)  # earlier text comes first
        text, _, num_before, _ = _replace_held(held + text, old, new, boundary, holds=False)
    return num_before


def _replace_held(text: str, old: str, new: str, boundary: int = 0, holds: bool = True) -> tuple[str, str, int, int]:
    """`text` with `old` replaced by `new` as ``str.replace`` does, but for its end that may begin an
    occurrence of `old` (returned second; a later input follows it), unless not `holds`. An
    occurrence starting before that end lies in `text` (and is replaced) or runs past it (and its
    start would be in that end). Also returned: how many characters of the output, and of the end
    held, come from `text`'s first `boundary` characters (`new` is ``old[1:1 + len(new)]``: the
    characters a replacement keeps)."""
    parts, at, num_before = [], 0, 0
    while (found := text.find(old, at)) >= 0:
        parts += (text[at:found], new)
        num_before += max(0, min(found, boundary) - at) + max(0, min(found + 1 + len(new), boundary) - found - 1)
        at = found + len(old)
    tail = text[at:]
    hold = next((size for size in range(len(old) - 1, 0, -1) if tail.endswith(old[:size])), 0) if holds else 0
    kept_end = len(text) - hold
    parts.append(text[at:kept_end])
    num_before += max(0, min(kept_end, boundary) - at)
    return "".join(parts), text[kept_end:], num_before, max(0, boundary - kept_end)


class IncrementalDetokenizer:
    """Turns a stream of token ids into text deltas; see the module docstring for the invariants.

    `skip_special_tokens` follows `tokenizers`: tokens the tokenizer marks special decode to nothing
    when true and to their content when false. `context_ids`: ids before the output (their last
    `CONTEXT_IDS` are decoded with it, their text not emitted). `holds_byte_runs`: false for a caller
    that places text rather than streams it (echo offsets): a byte-fallback run then shows its text
    as its characters complete, as if no later byte could change it. `clean_up_spaces`: the deltas are
    transformers' tokenization-space cleanup of the text (`SpaceCleanup`; the context is not cleaned).
    Mutates only its own state; `tokenizer` is read-only.
    """

    def __init__(self, tokenizer: Decoder, *, skip_special_tokens: bool = True, context_ids: Sequence[int] = (),
                 holds_byte_runs: bool = True, clean_up_spaces: bool = False):
        self._tokenizer = tokenizer
        self._cleanup = SpaceCleanup() if clean_up_spaces else None
        self._skip_special_tokens = skip_special_tokens
        self._skipped_specials: dict[int, bool] = {}
        self._is_byte_fallback = holds_byte_runs and _reads_byte_groups(tokenizer)
        # the context, then the ids that produce text (ids that decode to nothing are dropped)
        self._ids: list[int] = self._usable_context(context_ids)
        self._num_tokens = 0
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._open_text = ""  # the pending ids' text (ends in U+FFFD), "" when none are pending (unsettled)
        self._finished = False
        self._prefix_text: str | None = None  # decode of ids[prefix_offset:read_offset], cached until they move
        # Settled pending text (see the module docstring): ids[read_offset:live_start] read as the
        # pieces, then ids[live_start:] decode to the live text. live_start == prefix_offset: unsettled.
        self._settled: list[str] = []
        self._settled_len = 0  # characters in the settled pieces
        self._live_start = self._prefix_offset
        self._live_text = ""
        self._next_settle = 0  # ids in the live window at the next settling try
        self._in_byte_run = False  # byte fallback: the last id that is not a skipped special is a byte token
        self._run_check = codecs.getincrementaldecoder("utf-8")()  # the open run's bytes, strictly
        self._is_run_valid = True  # no UTF-8 error in the open run's bytes so far
        self._is_text_stale = False  # ids fed since the pending text was last decoded (a valid open run)
        self._context_run = self._ending_byte_run(self._ids)  # the context's last ids that a first byte joins
        self._probe_ids: tuple[int, ...] | None = None  # `ends_in_stray_byte`'s byte tokens, found on first use
        # the last feed's delta before the space cleanup: the text of its ids in context (log-probability
        # offsets count it, less `num_removed`, as the cleanup moves text held back to a later delta)
        self.uncleaned_delta = ""
        self.delta_start = 0  # characters of text before the last feed's uncleaned_delta (with the cleanup)
        self._num_carried = 0

    def _usable_context(self, context_ids: Sequence[int]) -> list[int]:
        """The last `CONTEXT_IDS` of `context_ids`, or none where they hold no text but special
        tokens' (a lone BOS: the output starts the text) or end inside a character."""
        context = list(context_ids[-CONTEXT_IDS:])
        if not context or not self._tokenizer.decode(context, skip_special_tokens=True):
            return []
        decoded = self._tokenizer.decode(context, skip_special_tokens=self._skip_special_tokens)
        return [] if decoded.endswith(REPLACEMENT_CHAR) else context

    @property
    def num_tokens(self) -> int:
        """Ids fed so far."""
        return self._num_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Ids fed whose text has not been emitted yet (an incomplete UTF-8 character, or a
        byte-fallback run that a later byte can still change)."""
        return len(self._ids) - self._read_offset

    @property
    def open_text(self) -> str:
        """The text the pending ids decode to so far, ending in U+FFFD for the open character (or a
        byte-fallback run's text; "" when no id is pending); it holds any complete character before
        the open one. Built on each call
        (as long as the pending text): a caller reading it per id reads `settled_pieces` instead."""
        self._refresh()
        if self._settled:
            return "".join(self._settled) + self._live_text
        return self._open_text

    @property
    def unsettled_open_text(self) -> str:
        """The part of `open_text` after its settled pieces (all of it when none is settled)."""
        self._refresh()
        return self._live_text if self._settled else self._open_text

    def _refresh(self) -> None:
        """Decodes the pending text that feeding a valid open run left undecoded."""
        if self._is_text_stale:
            self._is_text_stale = False
            if self._settled:
                self._live_text = self._decode(self._live_start, len(self._ids))
            else:
                self._open_text = self._decode(self._prefix_offset, len(self._ids))[len(self._prefix()) :]

    def fixed_open_text(self, start: int = 0, then: str = "") -> str:
        """The pending text from character `start` on that no later id changes: `open_text` but its
        last character (the open one, U+FFFD, which a later id may complete, or a stray byte the text
        alone cannot tell from one). "" while a byte-fallback run is open (a later byte can change the
        whole run's text) or the pending ids show no text. While the ids stay pending it only grows,
        so a caller reads each character once by passing the number it has read; a call costs the
        unsettled text and the pieces settled after `start`, not the whole pending text. With the
        space cleanup it is the cleaned text that follows the deltas (the text the cleanup holds
        first), and a call costs the whole pending text. `then`: text known to follow it (the U+FFFD
        of a stray byte), given with it (the cleanup may hold a space before it)."""
        if self._cleanup is None:
            return self._fixed_open_text(start) + then
        return self._cleanup.copy().push(self._fixed_open_text() + then)[start:]

    def _fixed_open_text(self, start: int = 0) -> str:
        if self._is_byte_fallback and self._in_byte_run:
            return ""
        live = self._live_text if self._settled else self._open_text
        if not live.endswith(REPLACEMENT_CHAR):
            return ""
        parts, at = [live[:-1]], self._settled_len  # at: where the first of `parts` starts
        for piece in reversed(self._settled):
            if at <= start:
                break
            at -= len(piece)
            parts.append(piece)
        return "".join(reversed(parts))[max(0, start - at):]

    def ends_in_stray_byte(self) -> bool:
        """Whether the pending text's last character is a U+FFFD that no later id changes (a stray
        byte, or a literal U+FFFD), not an open character. Decodes the pending window followed by each
        of the lone bytes 0x80 and 0xA0 (one of them continues any open character's bytes): an open
        character then reads the same or completes, a final U+FFFD gains one U+FFFD after it. False
        where the tokenizer has no such byte tokens, or while a byte-fallback run is open."""
        if self._is_byte_fallback and self._in_byte_run or self._read_offset == len(self._ids):
            return False
        if self._probe_ids is None:
            self._probe_ids = _continuation_byte_ids(self._tokenizer)
        start = self._live_start if self._settled else self._prefix_offset
        text = self._decode(start, len(self._ids))
        if not self._probe_ids or not text.endswith(REPLACEMENT_CHAR):
            return False
        window = self._ids[start:]
        return all(self._tokenizer.decode(window + [probe], skip_special_tokens=self._skip_special_tokens)
                   == text + REPLACEMENT_CHAR for probe in self._probe_ids)

    @property
    def num_settled_pieces(self) -> int:
        """Pieces of settled pending text so far (`settled_pieces`); 0 when none is settled."""
        return len(self._settled)

    def settled_pieces(self, start: int = 0) -> list[str]:
        """The settled pieces from `start` on: joined, all of them begin `open_text` and no later id
        changes them while the ids stay pending (they are dropped when the text is emitted)."""
        return self._settled[start:]

    def feed(self, token_id: int) -> str:
        """Adds one generated id and returns the newly complete text ("" while a character is open)."""
        text = self.uncleaned_delta = self._feed(token_id)
        if self._cleanup is None:
            return text
        self.delta_start = self._cleanup.num_pushed
        text = self._cleanup.push(text)
        self._num_carried = self._cleanup.num_carried
        return text

    @property
    def num_removed(self) -> int:
        """How many characters of the text before the last feed's `uncleaned_delta` the space cleanup
        removes, as far as it knows (text it holds read as if the output ended there); 0 without it."""
        return 0 if self._cleanup is None else self._cleanup.num_removed

    @property
    def cleans_spaces(self) -> bool:
        """Whether the deltas are transformers' tokenization-space cleanup of the text."""
        return self._cleanup is not None

    def removed_before(self, position: int) -> int | None:
        """How many of the first `position` characters of the text before the cleanup (the deltas'
        `uncleaned_delta`, joined) the space cleanup removes, None while later text can still change
        that (it holds a space among them); 0 without the cleanup."""
        return 0 if self._cleanup is None else self._cleanup.removed_before(position)

    @property
    def num_carried(self) -> int:
        """How many characters the last delta (of `feed` or `finish`) begins with that are the text of
        earlier ids, which the space cleanup held back until then; 0 without it."""
        return self._num_carried

    def _feed(self, token_id: int) -> str:
        if self._finished:
            raise ValueError("feed after finish")
        self._num_tokens += 1
        self._ids.append(token_id)
        if self._context_run and not self._is_skipped_special(token_id):
            self._start_after_context_run(token_id)
        holds_run = self._holds_byte_run(token_id)
        if holds_run:  # its text waits for the token that ends it, valid or not: not decoded now
            self._is_text_stale = True
            return ""
        self._is_text_stale = False
        if self._settled:
            return self._feed_settled(holds_run)
        prefix_text = self._prefix()
        new_text = self._decode(self._prefix_offset, len(self._ids))
        if new_text.endswith(REPLACEMENT_CHAR):
            self._open_text = new_text[len(prefix_text) :]
            self._try_settle(new_text, prefix_text)
            return ""
        if holds_run:  # a later byte can still change the run's text
            self._open_text = new_text[len(prefix_text) :]
            return ""
        if len(new_text) <= len(prefix_text):
            if self._is_skipped_special(token_id):  # decodes to nothing anywhere: leave it out of later windows
                self._ids.pop()
            # Otherwise it stays pending: a SentencePiece ``▁`` first in the text reads as nothing
            # alone but keeps the space of the word after it.
            return ""
        self._emitted()
        return new_text[len(prefix_text) :]

    def _ending_byte_run(self, context: list[int]) -> int:
        """Byte fallback: how many of the context's last ids are a run of byte tokens (skipped special
        tokens among and after them included, which do not end a run); 0 where it ends in no byte."""
        if not self._is_byte_fallback:
            return 0
        count, last_byte = 0, 0
        for token_id in reversed(context):
            if _byte_of(self._tokenizer, token_id) is not None:
                count = last_byte = count + 1
            elif self._is_skipped_special(token_id):
                count += 1
            else:
                break
        return last_byte

    def _start_after_context_run(self, token_id: int) -> None:
        """The first output id that a skipping does not remove, after a context ending in a run of
        byte tokens: a byte token would join that run, and a stray one would turn the run's characters
        into U+FFFD per byte (the output then showed the prompt's "é" as one more U+FFFD). The run is
        then left out of the context (all of it where what is left holds no text), so the output's
        bytes read as a group of their own, as the output decoded alone reads them."""
        run, self._context_run = self._context_run, 0
        if _byte_of(self._tokenizer, token_id) is None:
            return
        context = self._ids[: self._read_offset - run]
        if not self._tokenizer.decode(context, skip_special_tokens=True):
            context = []
        self._ids = context + self._ids[self._read_offset :]
        self._prefix_offset = self._live_start = 0
        self._read_offset = len(context)
        self._prefix_text = None

    def _holds_byte_run(self, token_id: int) -> bool:
        """Byte fallback: whether `token_id` leaves a run of byte tokens open (its text pending)."""
        if self._is_byte_fallback and not self._is_skipped_special(token_id):
            byte = _byte_of(self._tokenizer, token_id)
            if not self._in_byte_run:
                self._run_check.reset()
                self._is_run_valid = True
            self._in_byte_run = byte is not None
            if byte is not None and self._is_run_valid:
                try:
                    self._run_check.decode(bytes((byte,)))
                except UnicodeDecodeError:
                    self._is_run_valid = False
        return self._in_byte_run

    def _feed_settled(self, holds_run: bool) -> str:
        """`feed` once some pending text is settled: only the live window is decoded."""
        live_text = self._decode(self._live_start, len(self._ids))
        self._live_text = live_text
        if live_text.endswith(REPLACEMENT_CHAR) or not live_text:
            self._try_settle(live_text, "")
            return ""
        if holds_run:
            return ""
        delta = "".join(self._settled) + live_text
        self._emitted()
        return delta

    def _emitted(self) -> None:
        """The pending ids' text was emitted: they become the next window's prefix."""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        self._prefix_text = None
        self._open_text = ""
        self._settled, self._settled_len = [], 0
        self._live_start, self._live_text, self._next_settle = self._prefix_offset, "", 0
        self._is_text_stale = False

    def _try_settle(self, window_text: str, prefix_text: str) -> None:
        """Settles the text of all but the last `SETTLE_IDS` ids of a long live window (whose text,
        `window_text`, begins with `prefix_text`) where no later id can change it (module docstring)."""
        live_ids = len(self._ids) - self._live_start
        if live_ids < max(2 * SETTLE_IDS, self._next_settle):
            return
        start = len(self._ids) - SETTLE_IDS
        if start <= self._read_offset:
            return
        self._next_settle = live_ids + SETTLE_IDS  # where this try fails, the next waits for more ids
        live_text = self._decode(start, len(self._ids))
        if len(live_text) < MIN_LIVE_CHARS or not window_text.endswith(live_text):
            return
        before = window_text[: len(window_text) - len(live_text)]
        if len(before) < len(prefix_text) or not before.startswith(prefix_text):
            return
        if self._is_byte_fallback:
            if not self._is_invalid_for_good(start):
                return
        elif not all(self._decode(start, len(self._ids) - cut).endswith(REPLACEMENT_CHAR) for cut in (1, 2, 3)):
            return
        piece = before[len(prefix_text) :]
        self._settled.append(piece)
        self._settled_len += len(piece)
        self._live_start, self._live_text, self._next_settle = start, live_text, 0
        self._open_text = ""

    def feed_many(self, token_ids: Sequence[int]) -> str:
        """Feeds several ids and returns their combined delta (same text as feeding one by one)."""
        return "".join(self.feed(token_id) for token_id in token_ids)

    def finish(self) -> str:
        """Ends the stream and returns pending text, with U+FFFD for any incomplete character.

        Called at EOS, output limit, stop or cancellation; the detokenizer accepts no ids after it.
        """
        if self._finished:
            return ""
        tail = self.uncleaned_delta = self._finish()
        if self._cleanup is None:
            return tail
        text = self._cleanup.push(tail)
        carried = self._cleanup.num_carried
        held = self._cleanup.flush()  # pushed before the tail's text: carried where that shows none
        self._num_carried = carried + len(held) if carried == len(text) else carried
        return text + held

    def _finish(self) -> str:
        self._finished = True
        if self._read_offset == len(self._ids):
            return ""
        if self._settled:
            tail = "".join(self._settled) + self._decode(self._live_start, len(self._ids))
        else:
            tail = self._decode(self._prefix_offset, len(self._ids))[len(self._prefix()) :]
        self._emitted()
        return tail

    def _is_invalid_for_good(self, start: int) -> bool:
        """Byte fallback: whether the live window (ids[start:]) reads as the end of the whole window
        whatever ids follow: a token in it ends the run that crosses `start` (ids after it read alike
        in both), or the open run and the live window's bytes both hold a UTF-8 error that no later
        byte mends (a run holding one reads U+FFFD per byte, in the live window and the whole one)."""
        if self._is_run_valid:
            return False
        raw = bytearray()
        for token_id in self._ids[start:]:
            byte = _byte_of(self._tokenizer, token_id)
            if byte is None and not self._is_skipped_special(token_id):
                return True
            if byte is not None:
                raw.append(byte)
        try:
            codecs.getincrementaldecoder("utf-8")().decode(bytes(raw))
        except UnicodeDecodeError:
            return True
        return False

    def _is_skipped_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token that skipping removes from every decode."""
        if not self._skip_special_tokens:
            return False
        known = self._skipped_specials.get(token_id)
        if known is None:
            known = (not self._tokenizer.decode([token_id], skip_special_tokens=True)
                     and bool(self._tokenizer.decode([token_id], skip_special_tokens=False)))
            self._skipped_specials[token_id] = known
        return known

    def _prefix(self) -> str:
        """The emitted window's text (ids[prefix_offset:read_offset]), decoded once per window."""
        if self._prefix_text is None:
            self._prefix_text = self._decode(self._prefix_offset, self._read_offset)
        return self._prefix_text

    def _decode(self, start: int, end: int) -> str:
        if start == end:
            return ""
        return self._tokenizer.decode(self._ids[start:end], skip_special_tokens=self._skip_special_tokens)


def _byte_of(tokenizer: Decoder, token_id: int) -> int | None:
    """The byte of a byte-fallback token (spelled ``<0xNN>``), None for any other id."""
    token = tokenizer.id_to_token(token_id)
    if token is None or len(token) != 6 or not token.startswith("<0x") or not token.endswith(">"):
        return None
    try:
        return int(token[3:5], 16)
    except ValueError:
        return None


def _continuation_byte_ids(tokenizer: Decoder) -> tuple[int, ...]:
    """The ids of the lone bytes 0x80 and 0xA0 (byte-fallback ``<0xNN>`` or byte-level alphabet
    tokens, each decoding alone to U+FFFD), or () where the tokenizer has no such pair."""
    if not hasattr(tokenizer, "token_to_id"):
        return ()
    for spell in (lambda byte: f"<0x{byte:02X}>", lambda byte: _BYTE_LEVEL_CHARS[byte]):
        ids = tuple(tokenizer.token_to_id(spell(byte)) for byte in (0x80, 0xA0))
        if all(token_id is not None and tokenizer.decode([token_id], skip_special_tokens=False) == REPLACEMENT_CHAR
               for token_id in ids):
            return ids
    return ()


# GPT-2's byte-level alphabet (`tokenizers`' ByteLevel): printable bytes spell themselves, the others
# U+0100 on, in byte order. Only the two bytes `_continuation_byte_ids` needs are kept.
_BYTE_LEVEL_CHARS = {0x80: chr(0x100 + 0x21 + 0x80 - 0x7F), 0xA0: chr(0x100 + 0x21 + 0xA0 - 0x7F)}


def _reads_byte_groups(tokenizer: Decoder) -> bool:
    """Whether `tokenizer` decodes ``<0xNN>`` tokens as bytes (a lone 0x80 reads U+FFFD)."""
    if not hasattr(tokenizer, "token_to_id"):
        return False
    token_id = tokenizer.token_to_id("<0x80>")
    return token_id is not None and tokenizer.decode([token_id], skip_special_tokens=True) == REPLACEMENT_CHAR


# The second bytes a lead byte allows where UTF-8 narrows them (no overlong form, no surrogate, nothing
# past U+10FFFF); any other lead byte takes 0x80-0xBF.
_SECOND_BYTES = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}


def lossy_utf8(data: bytes) -> tuple[int, bytes]:
    """The characters the lossy UTF-8 decoding of `data` completes and the bytes of a character it
    leaves open, read as `tokenizers` reads them (Rust's ``from_utf8_lossy``): one U+FFFD per maximal
    invalid part. Python's incremental decoder holds a lead byte whose next byte no character can
    follow it with (``ED A1``: a surrogate) as open; it is a stray byte at once."""
    num_chars, open_bytes = 0, data
    while True:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        num_chars += len(decoder.decode(open_bytes))
        open_bytes = decoder.getstate()[0]
        low, high = _SECOND_BYTES.get(open_bytes[0], (0x80, 0xBF)) if open_bytes else (0, 0)
        if len(open_bytes) < 2 or low <= open_bytes[1] <= high:
            return num_chars, open_bytes
        num_chars += 1  # the lead byte alone
        open_bytes = open_bytes[1:]
